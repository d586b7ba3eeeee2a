import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { el } from './format';
import { isRun, liveParts, NodeTails, outcome, POLL } from './joblive';
import { FINISHED_STATES, IJobList, IJobModel } from './model';
import { requestAPI } from './request';

/** Lines shown per node: the newest ones. */
const TAIL = 40;
/** A cell runs (the hang watchdog may have found it hung). */
const RUNNING_STATES = ['RUNNING', 'HUNG'];

/**
 * Any job of the server in the main area, opened from the Multi-node jobs panel ("View"): a `--bg`
 * cell, a papermill run, a script's `Cluster`, another tab's notebook, a submitted run. It follows
 * the job by its id as the cell's own stand-in (`jobview.ts`) does: state and elapsed time, each
 * node's ranks, GPU and transport and its newest lines, Cancel while a cell runs, and the last
 * cell's value or root cause and traceback once it has ended (as text: where the object is
 * depends on how the cell ran). A submitted run shows the cell it is at and its newest gang's
 * nodes. Its tab is named by the job's id: two runs of one notebook are two tabs told apart. It
 * polls once a second while shown, backs off while the server fails, and stops once the job has
 * finished (its gang closed, its run ended).
 */
export class JobPage extends Widget {
  constructor(readonly jobId: string) {
    super();
    this.addClass('jp-mn-JobView');
    this.addClass('jp-mn-JobPage');
    this.title.label = `Job: ${jobId}`;
    this._poll = new Poll({
      factory: () => this._tick(),
      frequency: POLL,
      standby: () => !this.isVisible || 'when-hidden',
      name: `jupyter-mn:job:${jobId}`
    });
  }

  dispose(): void {
    this._poll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this._poll.refresh();
  }

  private async _tick(): Promise<void> {
    try {
      await this._update();
    } catch (error) {
      this._note(`Cannot reach the jupyter_mn server extension: ${String(error)}`);
      throw error; // the poll backs off
    }
  }

  private async _update(): Promise<void> {
    const list = await requestAPI<IJobList>('jobs');
    const job = list.jobs.find(j => j.id === this.jobId);
    if (!job) {
      this._note(`Job ${this.jobId} is not in the registry (forgotten).`);
      void this._poll.stop();
      return;
    }
    this.title.label = `Job: ${job.id}`;
    this.title.caption = job.link ?? job.notebook ?? job.launcher;
    const gang = isRun(job) ? newestGang(list.jobs, job.id) ?? job : job;
    if (gang.id !== this._following) {
      this._following = gang.id; // a run's next gang: its own nodes and lines
      this._tails = new NodeTails(TAIL);
    }
    if (gang.nodes.length) {
      await this._tails.follow(gang);
    }
    const finished = FINISHED_STATES.includes(job.state);
    const parts = liveParts(job, this._tails, list.now, job.state, gang);
    if (!RUNNING_STATES.includes(job.state) && job.last_cell) {
      parts.push(outcome(job.last_cell, false)); // a --bg cell's object is in its handle
    } else if (job.error && !job.last_cell) {
      parts.push(el('div', 'jp-mn-JobView-outcome jp-mn-JobView-error', job.error));
    }
    this.node.replaceChildren(...parts);
    if (finished) {
      void this._poll.stop(); // nothing more will change
    }
  }

  private _note(text: string): void {
    this.node.replaceChildren(el('div', 'jp-mn-JobView-note', text));
  }

  private _tails = new NodeTails(TAIL);
  /** the job whose nodes' lines `_tails` holds (a run's gang) */
  private _following = '';
  private _poll: Poll;
}

/** The newest gang the kernel of the run `runId` made. */
function newestGang(jobs: IJobModel[], runId: string): IJobModel | undefined {
  return jobs.filter(j => j.run === runId).sort((a, b) => b.started - a.started)[0];
}
