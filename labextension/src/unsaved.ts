import { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { IJobList, JOB_MIME } from './model';
import { requestAPI } from './request';

/** The parts of a notebook's widget read here (no dependency on the notebook package). */
interface IDocument {
  context: {
    path: string;
    ready: Promise<void>;
    model: { toJSON(): unknown };
  };
}

/**
 * A notebook opened while a `%%cluster` cell of its kernel runs (a reload, a second tab) shows the
 * cell's job only when the notebook was saved after the cell started: the job reference is in the
 * cell's saved output. When none of its outputs refers to that kernel, say so once, with a button
 * that opens the job's live view, instead of leaving an empty cell unexplained.
 */
export function noticeUnsavedRunningCells(
  app: JupyterFrontEnd,
  openJob: (id: string) => void
): void {
  const checked = new WeakSet<Widget>();
  app.shell.currentChanged?.connect((_, change) => {
    const widget = change.newValue;
    if (widget && 'context' in widget && !checked.has(widget)) {
      checked.add(widget);
      void check(app, widget as Widget & IDocument, openJob).catch(console.warn);
    }
  });
}

async function check(
  app: JupyterFrontEnd,
  widget: Widget & IDocument,
  openJob: (id: string) => void
): Promise<void> {
  const { context } = widget;
  await context.ready;
  // the notebook's kernel from the server: the kernel itself answers nothing while the cell runs
  const session = await app.serviceManager.sessions.findByPath(context.path);
  const kernel = session?.kernel?.id;
  const list = await requestAPI<IJobList>('jobs');
  const job = list.jobs.find(j => j.state === 'RUNNING' && kernel && j.kernel_id === kernel);
  if (!job || referencedKernels(context.model.toJSON()).has(kernel!)) {
    return;
  }
  Notification.info(
    `${context.path}: a %%cluster cell is running (job ${job.name}), but the notebook was not ` +
      'saved since it started, so the cell shows nothing of it here.',
    { autoClose: false, actions: [{ label: 'View', callback: () => openJob(job.id) }] }
  );
}

/** The kernels that the notebook's saved job references name. */
function referencedKernels(notebook: unknown): Set<string> {
  type Output = { data?: Record<string, { kernel_id?: string } | undefined> };
  const cells = (notebook as { cells?: Array<{ outputs?: Output[] }> }).cells ?? [];
  const kernels = new Set<string>();
  for (const cell of cells) {
    for (const output of cell.outputs ?? []) {
      const kernel = output.data?.[JOB_MIME]?.kernel_id;
      if (kernel) {
        kernels.add(kernel);
      }
    }
  }
  return kernels;
}
