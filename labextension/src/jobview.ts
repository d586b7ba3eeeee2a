import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { el, elapsed } from './format';
import { IJobList, IJobModel, ILogLine, ILogPage } from './model';
import { requestAPI } from './request';

/** A `%%cluster` cell's job reference (`jupyter_mn/views/widget.py`, `job_reference`). */
export const JOB_MIME = 'application/vnd.jupyter-mn.job+json';

/** Lines shown per node: the newest ones. */
const TAIL = 12;
/** How long the cell's widget gets to draw before this view stands in for it. */
const WIDGET_GRACE_MS = 1500;
const POLL_MS = 1000;
/** Polls without finding the kernel's job before this view gives up (a gang starts meanwhile). */
const GIVE_UP_AFTER = 300;

interface IJobReference {
  kernel_id: string;
  cell: number;
}

/**
 * Stands in for a running `%%cluster` cell's widget when the widget cannot be drawn: a page
 * reloaded, or a second tab opened, while the kernel runs the cell gets no widget state from
 * the kernel until the cell ends (it answers no request meanwhile). This view follows the job
 * from the server instead: state and elapsed time, each node's ranks, GPU and transport, its
 * newest lines, Cancel; and, once the cell ends, its outcome. It stays empty while the widget
 * beside it is drawn.
 */
export class JobView extends Widget implements IRenderMime.IRenderer {
  constructor() {
    super();
    this.addClass('jp-mn-JobView');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this._ref = model.data[JOB_MIME] as unknown as IJobReference;
    if (this._timer === 0) {
      this._timer = window.setTimeout(() => void this._tick(), WIDGET_GRACE_MS);
    }
  }

  dispose(): void {
    window.clearTimeout(this._timer);
    this._timer = -1;
    super.dispose();
  }

  /** The cell's own widget is drawn: nothing to stand in for. */
  private _widgetDrawn(): boolean {
    const area = this.node.closest('.jp-OutputArea');
    return area !== null && area.querySelector('.jp-mn-state') !== null;
  }

  private async _tick(): Promise<void> {
    if (this.isDisposed) {
      return;
    }
    let again = true;
    if (this._widgetDrawn() && !this._shown) {
      again = false; // this page has the widget: it shows the cell, value and all
    } else {
      try {
        again = await this._update();
      } catch (error) {
        this._status(`jupyter_mn: ${String(error)}`);
      }
    }
    if (again && !this.isDisposed) {
      this._timer = window.setTimeout(() => void this._tick(), POLL_MS);
    }
  }

  /**
   * Draw the job once more: all of it while the widget cannot be drawn, its outcome alone once
   * the widget is back (the widget does not show a value the page never received). False when
   * the cell is over: nothing more will change.
   */
  private async _update(): Promise<boolean> {
    const ref = this._ref!;
    const list = await requestAPI<IJobList>('jobs');
    const job = pickJob(list.jobs, ref.kernel_id);
    if (!job) {
      this._misses += 1; // not registered yet (a gang starting), or its record is gone
      return this._misses < GIVE_UP_AFTER;
    }
    if (job.last_cell !== null && job.last_cell.id > ref.cell) {
      return false; // a later cell ran since: this one's outcome is not kept
    }
    this._shown = true;
    const done = job.last_cell !== null && job.last_cell.id === ref.cell && job.state !== 'RUNNING';
    const parts: HTMLElement[] = [];
    if (!this._widgetDrawn()) {
      if (!done || this._lines.size === 0) {
        await this._follow(job);
      }
      parts.push(...this._live(job, list.now, done));
    }
    if (done && job.last_cell) {
      parts.push(outcome(job.last_cell));
    }
    this.node.replaceChildren(...parts);
    return !done;
  }

  private async _follow(job: IJobModel): Promise<void> {
    const query = this._cursor ? `after=${this._cursor}` : `tail=${TAIL * job.nodes.length}`;
    const page = await requestAPI<ILogPage>(`jobs/${job.id}/logs?${query}`);
    this._cursor = page.cursor;
    for (const line of page.lines) {
      const lines = this._lines.get(line.node) ?? [];
      lines.push(line);
      this._lines.set(line.node, lines.slice(-TAIL));
    }
  }

  /** The job as the widget would show it: header with Cancel, each node and its newest lines. */
  private _live(job: IJobModel, now: number, done: boolean): HTMLElement[] {
    const ended = job.ended ?? now;
    const header = el('div', 'jp-mn-JobView-header');
    header.append(
      el('b', '', job.name),
      ' ',
      el('span', 'jp-mn-JobView-state', done ? 'DONE' : job.state),
      ` ${job.shape} ${job.backend} · ${elapsed(ended - job.started)}`
    );
    if (!done && job.state === 'RUNNING') {
      header.append(' ', cancelButton(job));
    }
    const parts: HTMLElement[] = [header];
    for (const node of job.nodes) {
      const gpu = node.gpu_util === null ? 'no GPU' : `GPU ${Math.round(node.gpu_util)}%`;
      const transport = node.transport || 'transport not known yet';
      const row = `node ${node.node} ${node.host}: ranks ${node.ranks.join(' ')} · ${gpu} · ${transport}`;
      parts.push(el('div', 'jp-mn-JobView-node', row));
      const lines = (this._lines.get(node.node) ?? []).map(l => `[rank ${l.rank}] ${l.text}`);
      parts.push(el('pre', 'jp-mn-JobView-log', lines.join('\n')));
    }
    if (!done) {
      parts.push(el('div', 'jp-mn-JobView-note', 'live from the server while the kernel runs the cell'));
    }
    return parts;
  }

  private _status(text: string): void {
    this.node.replaceChildren(el('div', 'jp-mn-JobView-note', text));
  }

  private _ref: IJobReference | null = null;
  private _timer = 0;
  private _shown = false;
  private _misses = 0;
  private _cursor = '';
  private _lines = new Map<number, ILogLine[]>();
}

/** Cancel the job's running cell, as the Clusters panel does. */
function cancelButton(job: IJobModel): HTMLButtonElement {
  const cancel = el('button', 'jupyter-button jp-mn-JobView-cancel', 'Cancel');
  cancel.addEventListener('click', () => {
    cancel.disabled = true;
    cancel.textContent = 'Cancelling…';
    void requestAPI(`jobs/${job.id}/cancel`, { method: 'POST' }).catch(error => {
      cancel.textContent = `Cancel failed: ${String(error)}`;
    });
  });
  return cancel;
}

/** How the cell ended: rank 0's value as text and where the object is, or the root cause. */
function outcome(cell: NonNullable<IJobModel['last_cell']>): HTMLElement {
  const text = cell.ok
    ? `Out[${cell.id}]: ${cell.value ?? ''}   (the object is Out[${cell.id}] in the kernel)`
    : `the cell failed: ${cell.error ?? ''}`;
  return el('div', `jp-mn-JobView-outcome${cell.ok ? '' : ' jp-mn-JobView-error'}`, text);
}

/** The kernel's job: the running one, else the newest. */
function pickJob(jobs: IJobModel[], kernelId: string): IJobModel | undefined {
  const mine = jobs.filter(j => j.kernel_id === kernelId).sort((a, b) => b.started - a.started);
  return mine.find(j => j.state === 'RUNNING') ?? mine[0];
}

/** The renderer of job references, ranked before plain text. */
export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [JOB_MIME],
  createRenderer: () => new JobView()
};

const extension: IRenderMime.IExtension = {
  id: 'jupyter-mn:job-view',
  rendererFactory,
  rank: 0,
  dataType: 'json'
};

export default extension;
