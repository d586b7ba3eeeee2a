import { Dialog, showDialog } from '@jupyterlab/apputils';

import { el, elapsed } from './format';
import { IJobModel, ILogLine, ILogPage, MARK_RANK } from './model';
import { requestAPI } from './request';

/** How the views poll the server: once a second, backing off to 30 s while it fails. */
export const POLL = { interval: 1000, backoff: true, max: 30000 };

/** The job's newest lines per node, followed from the server (`jobs/<id>/logs?after=`). */
export class NodeTails {
  constructor(private _keep: number) {}

  /** Fetch the lines written since the last call (the newest ones on the first). */
  async follow(job: IJobModel): Promise<void> {
    const id = encodeURIComponent(job.id);
    const query = this._cursor ? `after=${this._cursor}` : `tail=${this._keep * job.nodes.length}`;
    const page = await requestAPI<ILogPage>(`jobs/${id}/logs?${query}`);
    this._cursor = page.cursor;
    for (const line of page.lines) {
      // a mark (where a cell starts or ends) comes once, and belongs to every node
      const nodes = line.rank === MARK_RANK ? job.nodes.map(n => n.node) : [line.node];
      for (const node of nodes) {
        const lines = this._lines.get(node) ?? [];
        lines.push(line);
        this._lines.set(node, lines.slice(-this._keep));
      }
    }
  }

  /** A node's lines as text; a cell's or script's start mark as a rule. */
  text(node: number): string {
    return (this._lines.get(node) ?? [])
      .map(l => (l.rank === MARK_RANK ? `──── ${l.text} ────` : `[rank ${l.rank}] ${l.text}`))
      .join('\n');
  }

  get empty(): boolean {
    return this._lines.size === 0;
  }

  private _cursor = '';
  private _lines = new Map<number, ILogLine[]>();
}

/** A cell's time on the ranks, as the cell's header says it (`views/summary.py`, `header`). */
export function took(seconds: number): string {
  return `${seconds.toFixed(1)} s`;
}

/** Whether `job` is a submitted run (a notebook's whole execution), not a gang. */
export function isRun(job: IJobModel): boolean {
  return job.output !== null;
}

/** A submitted run's progress: the cell it is at of the notebook's (papermill's injected
 * parameters not counted). */
export function runProgress(job: IJobModel): string {
  return `cell ${job.cells} of ${job.cells_total}`;
}

/**
 * The job as the cell's widget shows it: a header (name, `state`, shape, backend, elapsed time,
 * a run's `cell k of n`, Cancel while it runs), then each node's ranks, GPU and transport, and
 * its newest lines (a run's: those of `gang`, the newest gang its kernel made).
 */
export function liveParts(
  job: IJobModel,
  tails: NodeTails,
  now: number,
  state: string,
  gang: IJobModel = job
): HTMLElement[] {
  const header = el('div', 'jp-mn-JobView-header');
  header.append(
    el('b', '', job.name),
    ' ',
    el('span', 'jp-mn-JobView-state', state),
    ` ${job.shape} ${job.backend} · ${elapsed((job.ended ?? now) - job.started)}`
  );
  if (isRun(job)) {
    header.append(' · ', el('span', 'jp-mn-JobView-progress', runProgress(job)));
  }
  if (state === 'RUNNING') {
    header.append(' ', cancelButton(job));
  }
  const parts: HTMLElement[] = [header];
  if (gang !== job) {
    parts.push(el('div', 'jp-mn-JobView-gang', `gang ${gang.id} · ${gang.state}`));
  }
  for (const node of gang.nodes) {
    const gpu = node.gpu_util === null ? 'no GPU' : `GPU ${Math.round(node.gpu_util)}%`;
    const transport = node.transport || 'transport not known yet';
    const row = `node ${node.node} ${node.host}: ranks ${node.ranks.join(' ')} · ${gpu} · ${transport}`;
    parts.push(el('div', 'jp-mn-JobView-node', row));
    parts.push(el('pre', 'jp-mn-JobView-log', tails.text(node.node)));
  }
  return parts;
}

/**
 * How a cell ended: rank 0's value as text (a run's: its last cell's `Out[]`), or its outcome (a
 * user's stop is INTERRUPTED, not a failure), the root cause and its traceback. `inKernel`: the
 * kernel still holds the object (as `Out[n]`), so say where.
 */
export function outcome(cell: NonNullable<IJobModel['last_cell']>, inKernel: boolean): HTMLElement {
  const where = inKernel ? `   (the object is Out[${cell.id}] in the kernel)` : '';
  const ok = cell.outcome === 'DONE';
  const text = ok
    ? `Out[${cell.id}]: ${cell.value ?? ''}${where}`
    : `In[${cell.id}] ${cell.outcome}: ${cell.error ?? ''}`;
  const block = el('div', `jp-mn-JobView-outcome${ok ? '' : ' jp-mn-JobView-error'}`, text);
  if (!ok && cell.traceback) {
    block.appendChild(el('pre', 'jp-mn-JobView-traceback', cell.traceback));
  }
  return block;
}

/** Ask before cancelling a run: it ends the whole notebook's run, not one cell. */
export async function confirmCancel(job: IJobModel): Promise<boolean> {
  if (!isRun(job)) {
    return true; // a gang's cell stops; the gang stays up for the next one
  }
  const answer = await showDialog({
    title: `Cancel the run ${job.name}?`,
    body: `Its running cell (${runProgress(job)}) is interrupted and no further cell runs.`,
    buttons: [Dialog.cancelButton({ label: 'Keep running' }), Dialog.warnButton({ label: 'Cancel run' })]
  });
  return answer.button.accept;
}

/** Cancel the job's running cell (a run: the run), as the Multi-node jobs panel does. */
function cancelButton(job: IJobModel): HTMLButtonElement {
  const cancel = el('button', 'jupyter-button jp-mn-JobView-cancel', 'Cancel');
  cancel.addEventListener('click', async () => {
    if (!(await confirmCancel(job))) {
      return;
    }
    cancel.disabled = true;
    cancel.textContent = 'Cancelling…';
    void requestAPI(`jobs/${encodeURIComponent(job.id)}/cancel`, { method: 'POST' }).catch(error => {
      cancel.textContent = `Cancel failed: ${String(error)}`;
    });
  });
  return cancel;
}
