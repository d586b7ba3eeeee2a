/**
 * The one JSON shape of a job, mirrored from `jupyter_mn/jobs/registry.py` (`JobModel`, `NodeModel`).
 * tests/jobs/test_registry.py checks that both declare the same fields.
 */

export interface INodeModel {
  node: number;
  host: string;
  /** state of each rank of the node, by local rank ("ready", "error", "lost", ...) */
  ranks: string[];
  pids: number[];
  gpu_util: number | null;
  transport: string;
}

/** A job's last cell (`JobModel.last_cell`, written by `kernel/recorder.py`). */
export interface ILastCell {
  id: number;
  elapsed: number;
  value?: string;
  error?: string;
  /** nodes × GPUs × the cell's seconds, in hours */
  hours?: number;
  /** `CellOutcome`: DONE, FAILED, LOST, INTERRUPTED, HUNG or PREEMPTED */
  outcome: string;
  /** the root cause's traceback ("" or absent when the cell did not fail) */
  traceback?: string;
}

export interface IJobModel {
  id: string;
  name: string;
  gang: string;
  backend: string;
  shape: string;
  gpus: number;
  world_size: number;
  /** a gang state (PENDING ... READY, RUNNING, BROKEN, CLOSED), HUNG (a running cell the hang
   * watchdog found hung) or ORPHANED */
  state: string;
  started: number;
  detail: string;
  ended: number | null;
  heartbeat: number;
  host: string;
  pid: number;
  /** Kubernetes: the namespace of the job's objects */
  namespace: string;
  kernel_id: string | null;
  notebook: string | null;
  launcher: string;
  cells: number;
  /** what the gang runs now ("In[7]", "%cluster run train.py"); "" while it runs nothing */
  running: string;
  /** the last cell's outcome: rank 0's value as text, or the root cause */
  last_cell: ILastCell | null;
  error: string | null;
  nodes: INodeModel[];
  /** actions requested from the panel or the CLI that the kernel has not answered yet */
  pending: string[];
  /** the notebook's path relative to the server root, when it is under it */
  link: string | null;
  /** when the backend handed over the nodes (null: not yet, or never) */
  up: number | null;
  /** "GPU-hours", or "rank-hours" for ranks on CPUs ("" before the job said) */
  unit: string;
  /** nodes × GPUs × seconds held, in hours (a live job's so far, as of the server's read) */
  gpu_hours: number;
  /** `gpu_hours` in `unit` as a person reads it ("0.03 rank-hours"), "" until the unit is known */
  usage: string;
  /** a submitted run (`jupyter mn submit`): the executed notebook it writes */
  output: string | null;
  /** a submitted run: the code cells it runs (`cells` counts those started) */
  cells_total: number;
  /** a submitted run: `output` relative to the server root, when it is under it */
  output_link: string | null;
  /** a gang a submitted run's kernel made: the run's id ("" otherwise) */
  run: string;
}

/** GET jupyter-mn/api/jobs */
export interface IJobList {
  jobs: IJobModel[];
  /** the server's clock, so elapsed times do not depend on the browser's */
  now: number;
}

/** One log line as GET jupyter-mn/api/jobs/{id}/logs returns it. */
export interface ILogLine {
  node: number;
  seq: number;
  time: number;
  rank: number;
  /** "out", "err" (a rank's stderr: progress bars, warnings) or "error" (a failed cell's root
   * cause, `joblogs.ERROR_STREAM`) */
  stream: string;
  text: string;
}

export interface ILogPage {
  lines: ILogLine[];
  /** pass back as `after` to get only newer lines (follow mode) */
  cursor: string;
  state: string;
}

/** A `%%cluster` cell's job reference (`jupyter_mn/views/widget.py`, `JOB_MIME`). */
export const JOB_MIME = 'application/vnd.jupyter-mn.job+json';

/** The rank of a line that marks where a cell, script or command starts (`joblogs.MARK_RANK`). */
export const MARK_RANK = -1;

/** GET jupyter-mn/api/submit?path=: what submitting a notebook asks and takes from it. */
export interface ISubmitForm {
  /** the names its `parameters` cell assigns, each with its value there */
  parameters: Record<string, string>;
  /** its first `%%cluster` cell's flags, the run's defaults ("" without one) */
  cluster: string;
}

/** Job states the panel groups under "running", "idle" and "finished" (a gang's, then a
 * submitted run's: `jobs/runstate.py`). */
export const FINISHED_STATES = ['CLOSED', 'ORPHANED', 'SUCCEEDED', 'FAILED', 'CANCELLED'];
export const IDLE_STATES = ['READY'];
