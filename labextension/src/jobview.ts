import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { el } from './format';
import { liveParts, NodeTails, outcome, POLL } from './joblive';
import { IJobList, IJobModel, JOB_MIME } from './model';
import { requestAPI } from './request';


/** Lines shown per node: the newest ones. */
const TAIL = 12;
/** How long the cell's widget gets to draw before this view stands in for it. */
const WIDGET_GRACE_MS = 1500;
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
 * beside it is drawn. It polls once a second, backs off while the server fails, and stops once
 * the cell is over.
 */
export class JobView extends Widget implements IRenderMime.IRenderer {
  constructor() {
    super();
    this.addClass('jp-mn-JobView');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this._ref = model.data[JOB_MIME] as unknown as IJobReference;
    if (this._grace === 0) {
      this._grace = window.setTimeout(() => {
        this._poll = new Poll({
          factory: () => this._tick(),
          frequency: POLL,
          name: 'jupyter-mn:job-view'
        });
      }, WIDGET_GRACE_MS);
    }
  }

  dispose(): void {
    window.clearTimeout(this._grace);
    this._poll?.dispose();
    super.dispose();
  }

  /** The cell's own widget is drawn: nothing to stand in for. */
  private _widgetDrawn(): boolean {
    const area = this.node.closest('.jp-OutputArea');
    return area !== null && area.querySelector('.jp-mn-state') !== null;
  }

  private async _tick(): Promise<void> {
    let again = false; // this page has the widget: it shows the cell, value and all
    if (!this._widgetDrawn() || this._shown) {
      try {
        again = await this._update();
      } catch (error) {
        this.node.replaceChildren(el('div', 'jp-mn-JobView-note', `jupyter_mn: ${String(error)}`));
        throw error; // the poll backs off
      }
    }
    if (!again) {
      void this._poll!.stop();
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
    const standing = !this._widgetDrawn();
    this._hideWaitingWidget(standing);
    if (standing) {
      if (!done || this._tails.empty) {
        await this._tails.follow(job);
      }
      parts.push(...liveParts(job, this._tails, list.now, done ? 'DONE' : job.state));
      if (!done) {
        parts.push(el('div', 'jp-mn-JobView-note', 'live from the server while the kernel runs the cell'));
      }
    }
    if (done && job.last_cell) {
      parts.push(outcome(job.last_cell, true));
    }
    this.node.replaceChildren(...parts);
    return !done;
  }

  /**
   * While this view stands in, the widget's own output (ipywidgets' "Loading widget...", text
   * alone, waiting on a kernel that answers nothing until the cell ends) stays out of sight.
   */
  private _hideWaitingWidget(standing: boolean): void {
    const area = this.node.closest('.jp-OutputArea');
    area?.querySelectorAll('.jp-OutputArea-output').forEach(output => {
      if (output !== this.node) {
        const waiting = standing && output.childElementCount === 0;
        output.parentElement?.classList.toggle('jp-mn-waiting', waiting);
      }
    });
  }

  private _ref: IJobReference | null = null;
  private _grace = 0;
  private _poll: Poll | null = null;
  private _shown = false;
  private _misses = 0;
  private _tails = new NodeTails(TAIL);
}

/** The kernel's job: the running one, else the newest. */
function pickJob(jobs: IJobModel[], kernelId: string): IJobModel | undefined {
  const mine = jobs.filter(j => j.kernel_id === kernelId).sort((a, b) => b.started - a.started);
  return mine.find(j => j.state === 'RUNNING') ?? mine[0];
}

/** The renderer of job references, ranked before plain text. Not safe: it polls the server's
 * jobs and offers Cancel, so an untrusted notebook's output is shown as its plain text. */
export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: false,
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
