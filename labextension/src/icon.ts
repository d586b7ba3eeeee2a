import { LabIcon } from '@jupyterlab/ui-components';

/**
 * jupyter_mn's mark: one notebook cell (the bar) fanned out to a gang of ranks (the dots), so
 * its sidebar tab reads apart from the generic grids of other cluster panels.
 */
const SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">' +
  '<g class="jp-icon3" fill="#616161" stroke="#616161">' +
  '<rect x="7" y="2" width="10" height="5" rx="1.5" stroke="none"/>' +
  '<path d="M12 7v4M12 11L4.5 17M12 11v6M12 11l7.5 6" fill="none" stroke-width="1.6"/>' +
  '<circle cx="4.5" cy="19" r="2.5" stroke="none"/><circle cx="12" cy="19" r="2.5" stroke="none"/>' +
  '<circle cx="19.5" cy="19" r="2.5" stroke="none"/></g></svg>';

export const jobsIcon = new LabIcon({ name: 'jupyter-mn:jobs', svgstr: SVG });
