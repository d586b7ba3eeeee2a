"""Kubernetes backend: one Indexed Job per gang, gang-scheduled, all-or-nothing, nothing orphaned.

``manifests.py`` and ``gangs.py`` are pure builders; ``discovery.py`` asks the server what it can
do; ``provision.py`` creates, watches and tears down; ``podstate.py`` reads pod status;
``lease.py`` serializes client-side gangs; ``portforward.py`` connects back from outside;
``gc.py`` deletes what dead kernels left. Only ``provision.py`` and below import ``kubernetes``.
"""
