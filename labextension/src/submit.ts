import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  Notification,
  showDialog,
  showErrorMessage,
  WidgetTracker
} from '@jupyterlab/apputils';
import type { DocumentRegistry, IDocumentWidget } from '@jupyterlab/docregistry';
import { ServerConnection } from '@jupyterlab/services';
import { CommandToolbarButton } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { el } from './format';
import { jobsIcon } from './icon';
import { IJobModel, ISubmitForm } from './model';
import { requestAPI } from './request';

/** Submits the current notebook as a detached run (`jupyter mn submit`). */
export const SUBMIT = 'jupyter-mn:submit-notebook';

/**
 * The parameters dialog's body: one box per name of the notebook's `parameters` cell, holding its
 * value there; a box left so (or emptied) keeps that value, a changed one is passed (papermill
 * types it, as `jupyter mn submit -p` does).
 */
class ParametersForm extends Widget implements Dialog.IBodyWidget<Record<string, string>> {
  constructor(form: ISubmitForm) {
    super();
    this.addClass('jp-mn-SubmitForm');
    if (form.cluster) {
      this.node.appendChild(el('div', 'jp-mn-SubmitForm-cluster', `%%cluster ${form.cluster}`));
    }
    for (const [name, value] of Object.entries(form.parameters)) {
      const row = el('label', 'jp-mn-SubmitForm-row');
      row.appendChild(el('span', 'jp-mn-SubmitForm-name', name));
      const input = el('input', 'jp-mn-SubmitForm-value jp-mod-styled');
      input.name = name;
      input.value = input.defaultValue = value;
      row.appendChild(input);
      this.node.appendChild(row);
    }
  }

  getValue(): Record<string, string> {
    const values: Record<string, string> = {};
    for (const input of Array.from(this.node.querySelectorAll('input'))) {
      if (input.value.trim() && input.value !== input.defaultValue) {
        values[input.name] = input.value.trim();
      }
    }
    return values;
  }
}

/** Save `widget`'s notebook, ask for its parameters if it has any, submit it; null if the user
 * cancelled. A refusal (bad flag, unknown parameter, ...) is a `ResponseError` with its line. */
async function submit(
  widget: IDocumentWidget,
  settings: ServerConnection.ISettings
): Promise<IJobModel | null> {
  const path = widget.context.path;
  await widget.context.save(); // the run reads the file
  const form = await requestAPI<ISubmitForm>(
    `submit?path=${encodeURIComponent(path)}`,
    {},
    settings
  );
  let parameters: Record<string, string> = {};
  if (Object.keys(form.parameters).length) {
    const answer = await showDialog({
      title: `Submit ${widget.context.localPath}: parameters`,
      body: new ParametersForm(form),
      focusNodeSelector: 'input', // the first box: type at once
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Submit' })]
    });
    if (!answer.button.accept || answer.value === null) {
      return null;
    }
    parameters = answer.value;
  }
  return requestAPI<IJobModel>(
    'submit',
    { method: 'POST', body: JSON.stringify({ path, parameters }) },
    settings
  );
}

/**
 * The "Submit notebook as a detached run" command, in the palette and on every notebook's
 * toolbar: the run takes its shape and backend from the notebook's first `%%cluster` cell, and
 * shows in the Multi-node jobs panel (`panelId`), which it brings to the front.
 */
export function addSubmitCommand(
  app: JupyterFrontEnd,
  palette: ICommandPalette | null,
  panelId: string
): void {
  const settings = app.serviceManager.serverSettings;
  const notebooks = new WidgetTracker<IDocumentWidget>({ namespace: 'jupyter-mn-notebooks' });
  app.commands.addCommand(SUBMIT, {
    label: 'Submit Notebook as a Detached Run',
    caption: 'Run this notebook detached (jupyter mn submit), shaped by its first %%cluster cell',
    icon: jobsIcon,
    isEnabled: () => notebooks.currentWidget !== null,
    execute: async () => {
      const widget = notebooks.currentWidget;
      if (!widget) {
        return;
      }
      try {
        const job = await submit(widget, settings);
        if (job) {
          Notification.success(`Submitted ${widget.context.localPath} as ${job.id}`, {
            autoClose: 5000
          });
          app.shell.activateById(panelId);
        }
      } catch (error) {
        const reason = error instanceof ServerConnection.ResponseError ? error.message : error;
        void showErrorMessage('Submit failed', String(reason));
      }
    }
  });
  palette?.addItem({ command: SUBMIT, category: 'Multi-node jobs' });
  const toolbarButton: DocumentRegistry.IWidgetExtension<IDocumentWidget, DocumentRegistry.IModel> =
    {
      // a method: the Notebook factory's widgets are document widgets
      createNew(widget: IDocumentWidget) {
        void notebooks.add(widget);
        const button = new CommandToolbarButton({
          commands: app.commands,
          id: SUBMIT,
          label: 'Submit'
        });
        button.addClass('jp-mn-SubmitButton');
        widget.toolbar.addItem('jupyter-mn-submit', button);
        return button;
      }
    };
  app.docRegistry.addWidgetExtension('Notebook', toolbarButton);
}
