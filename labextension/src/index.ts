import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';

import { LogViewer } from './logviewer';
import { IJobModel } from './model';
import { ClustersPanel, clustersIcon } from './panel';

/** The "Clusters" sidebar and its log viewers. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-mn:clusters',
  description: 'jupyter_mn jobs of this server: state, logs, cancel, release',
  autoStart: true,
  optional: [ILayoutRestorer],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null) => {
    const settings = app.serviceManager.serverSettings;
    const viewers = new Map<string, MainAreaWidget<LogViewer>>();
    const openLogs = (job: IJobModel) => {
      let viewer = viewers.get(job.id);
      if (!viewer || viewer.isDisposed) {
        viewer = new MainAreaWidget({ content: new LogViewer(job, settings) });
        viewer.id = `jupyter-mn-logs-${job.id}`;
        viewer.title.label = `Logs: ${job.name}`;
        viewer.title.icon = clustersIcon;
        viewer.title.closable = true;
        viewers.set(job.id, viewer);
        app.shell.add(viewer, 'main');
      }
      app.shell.activateById(viewer.id);
    };
    const panel = new ClustersPanel(settings, {
      openLogs,
      openNotebook: path => void app.commands.execute('docmanager:open', { path })
    });
    app.shell.add(panel, 'left', { rank: 950 });
    restorer?.add(panel, panel.id);
  }
};

export default plugin;
