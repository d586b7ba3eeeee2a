import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';

import { JobPage } from './jobpage';
import { LogViewer } from './logviewer';
import { IJobModel } from './model';
import { ClustersPanel, clustersIcon } from './panel';
import { requestAPI } from './request';

/** Opens a job's log viewer by its id (the layout restorer reopens viewers through it). */
const OPEN_LOGS = 'jupyter-mn:open-logs';
/** Opens a job's live view by its id (the layout restorer reopens views through it). */
const OPEN_JOB = 'jupyter-mn:open-job';

/** The "Clusters" sidebar, its log viewers and its jobs' live views. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-mn:clusters',
  description: 'jupyter_mn jobs of this server: state, logs, cancel, release',
  autoStart: true,
  optional: [ILayoutRestorer],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null) => {
    const settings = app.serviceManager.serverSettings;
    const tracker = new WidgetTracker<MainAreaWidget<LogViewer>>({ namespace: 'jupyter-mn-logs' });
    const openLogs = (job: IJobModel) => {
      let viewer = tracker.find(v => v.content.jobId === job.id);
      if (!viewer) {
        viewer = new MainAreaWidget({ content: new LogViewer(job, settings) });
        viewer.id = `jupyter-mn-logs-${job.id}`;
        viewer.title.label = `Logs: ${job.name}`;
        viewer.title.icon = clustersIcon;
        viewer.title.closable = true;
        void tracker.add(viewer);
        app.shell.add(viewer, 'main');
      }
      app.shell.activateById(viewer.id);
    };
    const views = new WidgetTracker<MainAreaWidget<JobPage>>({ namespace: 'jupyter-mn-job' });
    const openJob = (id: string) => {
      let view = views.find(v => v.content.jobId === id);
      if (!view) {
        view = new MainAreaWidget({ content: new JobPage(id) });
        view.id = `jupyter-mn-job-${id}`;
        view.title.icon = clustersIcon;
        view.title.closable = true;
        void views.add(view);
        app.shell.add(view, 'main');
      }
      app.shell.activateById(view.id);
    };
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
    const panel = new ClustersPanel(settings, {
      openLogs,
      openJob: job => openJob(job.id),
      openNotebook: path => void app.commands.execute('docmanager:open', { path })
    });
    app.shell.add(panel, 'left', { rank: 950 });
    if (restorer) {
      restorer.add(panel, panel.id);
      void restorer.restore(tracker, {
        command: OPEN_LOGS,
        args: viewer => ({ id: viewer.content.jobId }),
        name: viewer => viewer.content.jobId
      });
      void restorer.restore(views, {
        command: OPEN_JOB,
        args: view => ({ id: view.content.jobId }),
        name: view => view.content.jobId
      });
    }
  }
};

export default plugin;
