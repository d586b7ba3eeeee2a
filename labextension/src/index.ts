import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { jobsIcon } from './icon';
import { JobPage } from './jobpage';
import { LogViewer } from './logviewer';
import { IJobModel } from './model';
import { JobsPanel } from './panel';
import { requestAPI } from './request';
import { addSubmitCommand } from './submit';
import { noticeUnsavedRunningCells } from './unsaved';

/** Opens a job's log viewer by its id (the layout restorer reopens viewers through it). */
const OPEN_LOGS = 'jupyter-mn:open-logs';
/** Opens a job's live view by its id (the layout restorer reopens views through it). */
const OPEN_JOB = 'jupyter-mn:open-job';

/**
 * Opens one main-area tab per job for a kind of view (log viewer, live view), brings an open one
 * to the front, and has the layout restorer reopen them through `command` by job id.
 */
function jobTabs<T extends Widget & { readonly jobId: string }>(
  app: JupyterFrontEnd,
  restorer: ILayoutRestorer | null,
  kind: string,
  command: string
): (jobId: string, make: () => T) => void {
  const tracker = new WidgetTracker<MainAreaWidget<T>>({ namespace: `jupyter-mn-${kind}` });
  void restorer?.restore(tracker, {
    command,
    args: tab => ({ id: tab.content.jobId }),
    name: tab => tab.content.jobId
  });
  return (jobId, make) => {
    let tab = tracker.find(t => t.content.jobId === jobId);
    if (!tab) {
      const content = make();
      content.title.icon = jobsIcon;
      tab = new MainAreaWidget({ content });
      tab.id = `jupyter-mn-${kind}-${jobId}`;
      void tracker.add(tab);
      app.shell.add(tab, 'main');
    }
    app.shell.activateById(tab.id);
  };
}

/** The "Multi-node jobs" sidebar, its log viewers, its jobs' live views and the command that
 * submits a notebook as a detached run. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-mn:clusters',
  description: 'jupyter_mn jobs of this server: state, logs, cancel, release; submit a notebook',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ) => {
    const settings = app.serviceManager.serverSettings;
    const logTabs = jobTabs<LogViewer>(app, restorer, 'logs', OPEN_LOGS);
    const openLogs = (job: IJobModel) => logTabs(job.id, () => new LogViewer(job, settings));
    const jobTab = jobTabs<JobPage>(app, restorer, 'job', OPEN_JOB);
    const openJob = (id: string) => jobTab(id, () => new JobPage(id));
    app.commands.addCommand(OPEN_JOB, {
      label: 'Open a jupyter_mn job',
      execute: args => openJob(String(args.id))
    });
    app.commands.addCommand(OPEN_LOGS, {
      label: 'Open a jupyter_mn job log',
      execute: async args => {
        const id = encodeURIComponent(String(args.id));
        openLogs(await requestAPI<IJobModel>(`jobs/${id}`, {}, settings));
      }
    });
    const panel = new JobsPanel(settings, {
      openLogs,
      openJob: job => openJob(job.id),
      openNotebook: path => void app.commands.execute('docmanager:open', { path }),
      // the run's kernel is gone: its executed notebook opens without one, to read
      openOutput: path =>
        void app.commands.execute('docmanager:open', {
          path,
          factory: 'Notebook',
          kernelPreference: { shouldStart: false, canStart: false }
        })
    });
    app.shell.add(panel, 'left', { rank: 950 });
    restorer?.add(panel, panel.id);
    addSubmitCommand(app, palette, panel.id);
    noticeUnsavedRunningCells(app, openJob);
  }
};

export default plugin;
