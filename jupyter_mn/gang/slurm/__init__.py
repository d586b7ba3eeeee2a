"""Slurm backend: one batch job of N nodes per gang (all-or-nothing by nature), nothing orphaned.

``script.py`` builds the batch script and the step's ``srun`` line (pure); ``commands.py`` is
the one place that runs ``sbatch``, ``squeue``, ``scontrol``, ``sinfo`` and ``scancel``;
``provision.py`` submits (or starts a step inside the kernel's own allocation), shows the pending
reason, connects back and cancels. The nodes run ``jupyter_mn.node.slurm``.
"""
