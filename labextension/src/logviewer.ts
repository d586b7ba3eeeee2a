import { ServerConnection } from '@jupyterlab/services';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { el } from './format';
import { FINISHED_STATES, IJobModel, ILogPage, MARK_RANK } from './model';
import { requestAPI } from './request';

/** Lines kept in the viewer; older ones are dropped (the full log stays on disk). */
const MAX_LINES = 5000;

/**
 * A job's logs in the main area: a node and a rank filter, and follow mode (poll once a second
 * for lines after the last cursor and keep the view at the bottom). Every line is inserted as
 * text, so log content can never become markup.
 */
export class LogViewer extends Widget {
  constructor(
    private _job: IJobModel,
    private _settings: ServerConnection.ISettings
  ) {
    super();
    this.addClass('jp-mn-LogViewer');
    this.title.label = `Logs: ${_job.id}`; // two runs of one notebook: two tabs told apart
    const bar = el('div', 'jp-mn-LogViewer-toolbar');
    this._node = this._select('node', 'All nodes');
    this._options(this._node, 'Node', _job.nodes.map(n => n.node));
    this._rank = this._select('rank', 'All ranks');
    this._node.addEventListener('change', () => this._rankOptions());
    this._rankOptions();
    const follow = el('label', 'jp-mn-LogViewer-follow');
    this._follow = el('input');
    this._follow.type = 'checkbox';
    this._follow.checked = true;
    this._follow.addEventListener('change', () => void this._poll.refresh());
    follow.append(this._follow, ' Follow');
    this._count = el('span', 'jp-mn-LogViewer-count');
    bar.append(this._node, this._rank, follow, this._count);
    this._text = el('div', 'jp-mn-LogViewer-text');
    this.node.append(bar, this._text);
    this._poll = new Poll({
      factory: () => this._fetch(),
      frequency: { interval: 1000, backoff: true, max: 30000 },
      standby: () => !this.isVisible || !this._follow.checked || 'when-hidden',
      name: `jupyter-mn:logs:${_job.id}`
    });
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this._poll.refresh();
  }

  /** The rank filter offers the ranks of the chosen node (all ranks when no node is chosen). */
  private _rankOptions(): void {
    const { gpus, world_size } = this._job;
    const node = this._node.value;
    const first = node ? Number(node) * gpus : 0;
    const count = node ? gpus : world_size;
    this._rank.replaceChildren(this._rank.options[0]);
    this._options(this._rank, 'Rank', Array.from({ length: count }, (_, i) => first + i));
  }

  private _options(select: HTMLSelectElement, label: string, values: number[]): void {
    for (const value of values) {
      select.appendChild(new Option(`${label} ${value}`, String(value)));
    }
  }

  private _select(name: string, all: string): HTMLSelectElement {
    const select = el('select', `jp-mn-LogViewer-${name}`);
    select.appendChild(new Option(all, ''));
    select.addEventListener('change', () => {
      this._filter += 1; // a page asked for under the old filter is dropped when it arrives
      this._cursor = '';
      this._marks.clear();
      this._text.replaceChildren();
      void this._poll.refresh();
    });
    return select;
  }

  private async _fetch(): Promise<void> {
    const query = new URLSearchParams({ tail: '1000', after: this._cursor });
    if (this._node.value) {
      query.set('node', this._node.value);
    }
    if (this._rank.value) {
      query.set('rank', this._rank.value);
    }
    const id = encodeURIComponent(this._job.id);
    const [filter, cursor] = [this._filter, this._cursor];
    const page = await requestAPI<ILogPage>(`jobs/${id}/logs?${query}`, {}, this._settings);
    if (filter !== this._filter || cursor !== this._cursor) {
      // The filter changed meanwhile (the poll does not start a refresh while one is pending),
      // or another request got there first: ask again, from where things stand now.
      return this._fetch();
    }
    this._cursor = page.cursor;
    const atBottom =
      this._text.scrollTop + this._text.clientHeight >= this._text.scrollHeight - 4;
    for (const line of page.lines) {
      if (line.rank === MARK_RANK) {
        // where a cell, script or command starts: in every node's file, shown once
        if (!this._marks.has(line.text)) {
          this._marks.add(line.text);
          this._text.appendChild(el('div', 'jp-mn-LogMark', `──── ${line.text} ────`));
        }
        continue;
      }
      const row = el('div', `jp-mn-LogLine jp-mn-LogLine-${line.stream}`);
      row.dataset.node = String(line.node);
      row.dataset.rank = String(line.rank);
      row.append(el('span', 'jp-mn-LogLine-label', `[node ${line.node} rank ${line.rank}] `));
      row.append(document.createTextNode(line.text));
      this._text.appendChild(row);
    }
    while (this._text.childElementCount > MAX_LINES) {
      this._text.firstElementChild!.remove();
    }
    this._count.textContent = `${this._text.childElementCount} lines · ${page.state}`;
    if (this._follow.checked && (atBottom || page.lines.length === this._text.childElementCount)) {
      this._text.scrollTop = this._text.scrollHeight;
    }
    if (FINISHED_STATES.includes(page.state) && page.lines.length === 0) {
      this._follow.checked = false; // nothing more will come
    }
  }

  /** the job, as the layout restorer names this viewer */
  get jobId(): string {
    return this._job.id;
  }

  private _cursor = '';
  private _marks = new Set<string>();
  /** bumped on every filter change: a slow page of the previous filter is not shown */
  private _filter = 0;
  private _node: HTMLSelectElement;
  private _rank: HTMLSelectElement;
  private _follow: HTMLInputElement;
  private _count: HTMLElement;
  private _text: HTMLElement;
  private _poll: Poll;
}
