"""The model every side shares: the spec and its options, results, the hang verdict, the
credential filter, ids and GPU-hours."""
