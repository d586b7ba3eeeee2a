import { Dialog, showDialog, showErrorMessage } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { counted, el, elapsed } from './format';
import { jobsIcon } from './icon';
import { confirmCancel, isRun, runProgress, took } from './joblive';
import { FINISHED_STATES, IDLE_STATES, IJobList, IJobModel } from './model';
import { requestAPI } from './request';

/** How many finished jobs the open "Finished" group lists, and how many more "Show more" adds:
 * weeks of jobs stay a short list. */
export const FINISHED_PAGE = 20;

/** What ORPHANED means, on the state badge's tooltip. */
export const ORPHANED_HELP =
  'ORPHANED: the kernel that ran this job is gone (it died or was shut down without ' +
  'releasing the gang). Its ranks normally end with it; `jupyter mn gc` kills any it left ' +
  'behind and forgets finished jobs older than 7 days. Forget removes it from this list.';

/** The state badge's tooltip: the gang's state is not the verdict on the last cell. */
export const GANG_STATE_HELP =
  "The gang's state (READY: its ranks are up and wait for a cell, also after a failed one). " +
  'How the last cell ended is on the line below.';

/** A fact of `job` that the panel updates in place on every poll: its elapsed time or usage. */
function ticking(className: string, job: IJobModel, fact: 'elapsed' | 'usage'): HTMLElement {
  const span = el('span', className);
  span.dataset.tick = job.id;
  span.dataset.fact = fact;
  return span;
}

/** The states in which a job runs something (`running` names it). */
const BUSY_STATES = ['RUNNING', 'HUNG'];

/**
 * What the job's cells do, apart from the gang's state: the cell it runs now, else how its last
 * cell ended (`CellOutcome`) in that outcome's colour, so a failed cell on a READY gang shows.
 */
function cellLine(job: IJobModel): HTMLElement | null {
  const line = el('div', 'jp-mn-Job-cell');
  if (job.running && BUSY_STATES.includes(job.state)) {
    line.appendChild(el('span', 'jp-mn-Outcome jp-mn-Outcome-RUNNING', 'running'));
    line.appendChild(el('span', 'jp-mn-Job-cellname', job.running));
    return line;
  }
  const last = job.last_cell;
  if (!last?.outcome) {
    return null;
  }
  line.appendChild(el('span', 'jp-mn-Job-cellname', `last cell In[${last.id}]`));
  line.appendChild(el('span', `jp-mn-Outcome jp-mn-Outcome-${last.outcome}`, last.outcome));
  line.appendChild(el('span', 'jp-mn-Job-cellelapsed', took(last.elapsed)));
  return line;
}

export interface IPanelActions {
  openLogs(job: IJobModel): void;
  openJob(job: IJobModel): void;
  openNotebook(path: string): void;
  /** a run's executed notebook, without a kernel */
  openOutput(path: string): void;
}

const GROUPS: Array<[string, string, (job: IJobModel) => boolean]> = [
  ['running', 'Running', job => !FINISHED_STATES.includes(job.state) && !IDLE_STATES.includes(job.state)],
  ['idle', 'Idle', job => IDLE_STATES.includes(job.state)],
  ['finished', 'Finished', job => FINISHED_STATES.includes(job.state)]
];

/** Whether `jobs` (a card: a job, and a run's gangs) match the filter box's text: each of its
 * words is in a job's name, id, notebook, state or its last cell's outcome (any case), so
 * `failed` finds a READY gang whose last cell failed. */
export function matches(jobs: IJobModel[], filter: string): boolean {
  const text = jobs
    .map(job =>
      [job.name, job.id, job.link ?? job.notebook ?? '', job.state, job.last_cell?.outcome ?? '']
        .join(' ')
    )
    .join(' ')
    .toLowerCase();
  return filter
    .toLowerCase()
    .split(/\s+/)
    .every(word => text.includes(word));
}

/** A submitted run's progress: the cell it is at of those it runs (a gang: its cell count). */
function cellsFact(job: IJobModel): string {
  return isRun(job) ? runProgress(job) : counted(job.cells, 'cell');
}

/** The cards of `jobs`: a submitted run's gangs are on its card (`JobModel.run`), every other
 * job has its own. */
function cards(jobs: IJobModel[]): Array<{ job: IJobModel; gangs: IJobModel[] }> {
  const runs = new Map(jobs.filter(isRun).map(run => [run.id, [] as IJobModel[]]));
  for (const job of jobs) {
    runs.get(job.run)?.push(job);
  }
  return jobs
    .filter(job => !runs.has(job.run))
    .map(job => ({ job, gangs: (runs.get(job.id) ?? []).sort((a, b) => a.started - b.started) }));
}

/** A job's title: its notebook's file name and its `--name` (an unnamed job's name is its id). */
function titleParts(job: IJobModel): { notebook: string | null; name: string | null } {
  const path = job.link ?? job.notebook;
  return {
    notebook: path ? path.split(/[\\/]/).pop()! : null,
    name: job.name !== job.id ? job.name : null
  };
}

/**
 * The left-sidebar "Multi-node jobs" panel: every jupyter_mn job of this server (gangs and
 * submitted runs, each run's gangs on its card), grouped as running, idle and finished, narrowed
 * by a filter box. Finished jobs are collapsed under a count, newest first, a page at a time,
 * and "Clear finished" forgets them all. It polls every 2 s while visible (backing off on
 * errors, pausing while hidden) and redraws only the jobs whose model changed.
 */
export class JobsPanel extends Widget {
  constructor(
    private _settings: ServerConnection.ISettings,
    private _actions: IPanelActions
  ) {
    super();
    this.id = 'jupyter-mn-clusters'; // the layout restorer knows the panel by this id
    this.addClass('jp-mn-ClustersPanel');
    this.title.icon = jobsIcon;
    this.title.caption = 'Multi-node jobs (jupyter_mn)';
    this.node.appendChild(el('h2', 'jp-mn-ClustersPanel-title', 'Multi-node jobs'));
    this._filter = el('input', 'jp-mn-Filter jp-InputGroup');
    this._filter.type = 'search';
    this._filter.placeholder = 'Filter by name, notebook or state';
    this._filter.setAttribute('aria-label', 'Filter jobs');
    this._filter.addEventListener('input', () => this._data && this._draw(this._data));
    this.node.appendChild(this._filter);
    for (const [key, label] of GROUPS) {
      const section = el('section', `jp-mn-Group jp-mn-Group-${key}`);
      if (key === 'finished') {
        section.appendChild(this._finishedHead());
      } else {
        section.appendChild(el('h3', '', label));
      }
      const list = el('ul', 'jp-mn-JobList');
      section.appendChild(list);
      this._lists.set(key, list);
      this.node.appendChild(section);
    }
    this._more = el('button', 'jp-Button jp-mn-Action jp-mn-Finished-more');
    this._more.addEventListener('click', () => {
      this._finishedShown += FINISHED_PAGE;
      void this._poll.refresh();
    });
    this._lists.get('finished')!.after(this._more);
    this._status = el('div', 'jp-mn-ClustersPanel-status');
    this.node.appendChild(this._status);
    this._poll = new Poll({
      factory: () => this.refresh(),
      frequency: { interval: 2000, backoff: true, max: 30000 },
      standby: () => !this.isVisible || 'when-hidden',
      name: 'jupyter-mn:clusters'
    });
  }

  /** The finished group's heading: a toggle with the count, and "Clear finished". */
  private _finishedHead(): HTMLElement {
    const head = el('div', 'jp-mn-Group-head');
    this._toggle = el('button', 'jp-mn-Group-toggle');
    this._toggle.setAttribute('aria-expanded', 'false');
    this._toggle.addEventListener('click', () => {
      const open = this._toggle.getAttribute('aria-expanded') !== 'true';
      this._toggle.setAttribute('aria-expanded', String(open));
      this._finishedShown = FINISHED_PAGE;
      void this._poll.refresh();
    });
    head.appendChild(this._toggle);
    const clear = el('button', 'jp-Button jp-mn-Action jp-mn-Action-clear', 'Clear finished');
    clear.title = 'Forget every finished job and its logs (live jobs stay)';
    clear.addEventListener('click', () => void this._act('Clear finished', () => this._clear()));
    head.appendChild(clear);
    return head;
  }

  private async _clear(): Promise<void> {
    const count = this._finishedCount;
    const answer = await showDialog({
      title: 'Clear finished jobs',
      body: `Forget ${counted(count, 'finished job')} and the logs? Live jobs stay.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Clear' })]
    });
    if (!answer.button.accept) {
      return;
    }
    await requestAPI('jobs', { method: 'DELETE' }, this._settings); // the poll then redraws
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this._poll.refresh();
  }

  async refresh(): Promise<void> {
    let data: IJobList;
    try {
      data = await requestAPI<IJobList>('jobs', {}, this._settings);
    } catch (error) {
      this._status.textContent = `Cannot reach the jupyter_mn server extension: ${error}`;
      throw error; // the poll backs off
    }
    this._data = data;
    this._draw(data);
  }

  /** Show `data`'s jobs that match the filter box. */
  private _draw(data: IJobList): void {
    const filter = this._filter.value.trim();
    const all = cards(data.jobs);
    const shown = filter ? all.filter(c => matches([c.job, ...c.gangs], filter)) : all;
    this._status.textContent = !data.jobs.length
      ? 'No jobs yet: run a %%cluster cell.'
      : shown.length
        ? ''
        : `No job matches "${filter}".`;
    const seen = new Set<string>();
    const byId = new Map(data.jobs.map(job => [job.id, job]));
    for (const [key, , member] of GROUPS) {
      const list = this._lists.get(key)!;
      let jobs = shown.filter(c => member(c.job));
      list.parentElement!.classList.toggle('jp-mod-empty', jobs.length === 0);
      if (key === 'finished') {
        jobs = this._finishedPage(jobs);
      }
      jobs.forEach((card, index) => {
        seen.add(card.job.id);
        const item = this._item(card.job, card.gangs);
        if (list.children[index] !== item) {
          list.insertBefore(item, list.children[index] ?? null);
        }
        // elapsed time and usage tick in place, the card's and its gangs'
        for (const fact of Array.from(item.querySelectorAll<HTMLElement>('[data-tick]'))) {
          const job = byId.get(fact.dataset.tick!)!;
          fact.textContent =
            fact.dataset.fact === 'usage'
              ? job.usage
              : elapsed((job.ended ?? data.now) - job.started);
        }
      });
      while (list.children.length > jobs.length) {
        list.lastChild!.remove();
      }
    }
    for (const id of [...this._items.keys()]) {
      if (!seen.has(id)) {
        this._items.delete(id);
      }
    }
  }

  /** The finished jobs to list, newest ending first: none while collapsed, else a page more
   * for each "Show more"; the heading counts them all. */
  private _finishedPage<T extends { job: IJobModel }>(finished: T[]): T[] {
    const open = this._toggle.getAttribute('aria-expanded') === 'true';
    this._finishedCount = finished.length;
    this._toggle.textContent = `${open ? '▾' : '▸'} Finished (${finished.length})`;
    this._lists.get('finished')!.parentElement!.classList.toggle('jp-mod-collapsed', !open);
    const end = (job: IJobModel) => job.ended ?? job.started;
    const shown = open
      ? [...finished].sort((a, b) => end(b.job) - end(a.job)).slice(0, this._finishedShown)
      : [];
    const rest = open ? finished.length - shown.length : 0;
    this._more.hidden = rest === 0;
    this._more.textContent = `Show ${Math.min(rest, FINISHED_PAGE)} more (${rest} hidden)`;
    return shown;
  }

  /** The list item of a job (and a run's gangs): reused while their models are unchanged, so
   * clicks are never lost. */
  private _item(job: IJobModel, gangs: IJobModel[]): HTMLElement {
    const ticking = { heartbeat: 0, gpu_hours: 0, usage: '' }; // updated in place
    const key = JSON.stringify([job, ...gangs].map(j => ({ ...j, ...ticking })));
    const cached = this._items.get(job.id);
    if (cached && cached.key === key) {
      return cached.node;
    }
    const node = this._render(job, gangs);
    cached?.node.remove();
    this._items.set(job.id, { key, node });
    return node;
  }

  private _render(job: IJobModel, gangs: IJobModel[]): HTMLElement {
    const item = el('li', 'jp-mn-Job');
    item.dataset.jobId = job.id;
    item.dataset.state = job.state;
    const head = el('div', 'jp-mn-Job-head');
    const title = el('span', 'jp-mn-Job-title');
    const { notebook, name } = titleParts(job);
    if (notebook) {
      title.appendChild(el('span', 'jp-mn-Job-nb', notebook));
    }
    if (name || !notebook) {
      title.appendChild(el('span', 'jp-mn-Job-name', name ?? job.id));
    }
    head.appendChild(title);
    const state = el('span', `jp-mn-State jp-mn-State-${job.state}`, job.state);
    state.title = job.state === 'ORPHANED' ? ORPHANED_HELP : GANG_STATE_HELP;
    head.appendChild(state);
    item.appendChild(head);
    if (notebook || name) {
      item.appendChild(el('div', 'jp-mn-Job-id', job.id));
    }

    const facts = el('div', 'jp-mn-Job-facts');
    facts.appendChild(el('span', 'jp-mn-Job-shape', `${job.shape} · ${job.backend}`));
    facts.appendChild(ticking('jp-mn-Job-elapsed', job, 'elapsed'));
    facts.appendChild(el('span', 'jp-mn-Job-cells', cellsFact(job)));
    facts.appendChild(ticking('jp-mn-Job-usage', job, 'usage'));
    item.appendChild(facts);

    const badges = el('div', 'jp-mn-Job-badges');
    const util = job.nodes.map(n => n.gpu_util).filter((u): u is number => u !== null);
    const gpu = util.length
      ? `GPU ${Math.round(util.reduce((a, b) => a + b, 0) / util.length)}%`
      : 'no GPU';
    if (!isRun(job)) {
      badges.appendChild(el('span', 'jp-mn-Badge jp-mn-Badge-gpu', gpu)); // a run's gangs have theirs
    }
    const transports = [...new Set(job.nodes.map(n => n.transport).filter(t => t))];
    if (transports.length) {
      badges.appendChild(el('span', 'jp-mn-Badge jp-mn-Badge-transport', transports.join(', ')));
    }
    item.appendChild(badges);

    const cell = cellLine(job);
    if (cell) {
      item.appendChild(cell);
    }
    if (job.link) {
      const link = el('a', 'jp-mn-Job-notebook', job.link);
      link.href = '#';
      link.title = `Open ${job.link}`;
      link.addEventListener('click', event => {
        event.preventDefault();
        this._actions.openNotebook(job.link!);
      });
      item.appendChild(link);
    } else if (job.notebook || job.launcher) {
      const origin = el('div', 'jp-mn-Job-origin', job.notebook ?? job.launcher);
      origin.title = origin.textContent!;
      item.appendChild(origin);
    }
    if (job.error) {
      item.appendChild(el('div', 'jp-mn-Job-error', job.error));
    } else if (job.detail && FINISHED_STATES.includes(job.state)) {
      item.appendChild(el('div', 'jp-mn-Job-detail', job.detail));
    }
    if (job.pending.length) {
      item.appendChild(el('div', 'jp-mn-Job-pending', `${job.pending.join(', ')} requested…`));
    }
    if (gangs.length) {
      item.appendChild(this._gangList(gangs));
    }

    const buttons = this._buttons(item.appendChild(el('div', 'jp-mn-Job-actions')));
    buttons('View', () => this._actions.openJob(job));
    buttons('Logs', () => this._actions.openLogs(job));
    const output = job.output_link;
    if (output) {
      buttons('Output', () => this._actions.openOutput(output));
    }
    const finished = FINISHED_STATES.includes(job.state);
    const run = isRun(job); // a submitted run ends when cancelled: no release
    if (job.state === 'RUNNING' || (run && !finished)) {
      buttons('Cancel', async () => {
        if (await confirmCancel(job)) {
          await this._post(job, 'cancel');
        }
      });
    }
    if (finished) {
      buttons('Forget', async () => {
        await requestAPI(`jobs/${encodeURIComponent(job.id)}`, { method: 'DELETE' }, this._settings);
      });
    } else if (!run && !job.run) {
      // a gang of a run belongs to the run's kernel: Cancel the run instead
      buttons('Release', () => this._post(job, 'release'));
    }
    return item;
  }

  /** A run's gangs on its card, oldest first: id, state, shape, elapsed time, usage, View and
   * Logs (no Release: a gang of a run ends with the run, or is cancelled with it). */
  private _gangList(gangs: IJobModel[]): HTMLElement {
    const list = el('ul', 'jp-mn-Run-gangs');
    list.setAttribute('aria-label', 'Gangs of this run');
    for (const gang of gangs) {
      const row = el('li', 'jp-mn-Run-gang');
      row.dataset.jobId = gang.id;
      row.dataset.state = gang.state;
      row.append(
        el('span', 'jp-mn-Run-gangid', gang.id),
        el('span', `jp-mn-State jp-mn-State-${gang.state}`, gang.state),
        el('span', 'jp-mn-Run-gangshape', gang.shape),
        ticking('jp-mn-Run-gangelapsed', gang, 'elapsed'),
        ticking('jp-mn-Run-gangusage', gang, 'usage')
      );
      const buttons = this._buttons(row.appendChild(el('span', 'jp-mn-Run-gangactions')));
      buttons('View', () => this._actions.openJob(gang));
      buttons('Logs', () => this._actions.openLogs(gang));
      list.appendChild(row);
    }
    return list;
  }

  /** A function that adds a button to `parent`: its click runs the action, says why it failed
   * if it did, and refreshes the panel. */
  private _buttons(parent: HTMLElement): (label: string, run: () => Promise<void> | void) => void {
    return (label, run) => {
      const b = el('button', `jp-Button jp-mn-Action jp-mn-Action-${label.toLowerCase()}`, label);
      b.addEventListener('click', () => void this._act(label, run));
      parent.appendChild(b);
    };
  }

  private async _post(job: IJobModel, action: string): Promise<void> {
    const reply = await requestAPI<{ outcome: string | null }>(
      `jobs/${encodeURIComponent(job.id)}/${action}`,
      { method: 'POST' },
      this._settings
    );
    this._status.textContent = `${job.name}: ${reply.outcome ?? `${action} requested`}`;
  }

  private async _act(label: string, run: () => Promise<void> | void): Promise<void> {
    try {
      await run();
    } catch (error) {
      void showErrorMessage(`${label} failed`, String(error));
    }
    await this._poll.refresh();
  }

  private _lists = new Map<string, HTMLUListElement>();
  private _filter: HTMLInputElement;
  private _data: IJobList | null = null;
  private _toggle!: HTMLButtonElement;
  private _more: HTMLButtonElement;
  private _finishedShown = FINISHED_PAGE;
  private _finishedCount = 0;
  private _items = new Map<string, { key: string; node: HTMLElement }>();
  private _status: HTMLElement;
  private _poll: Poll;
}
