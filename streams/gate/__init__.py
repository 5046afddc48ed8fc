"""The promotion gate: joins each candidate's critic verdicts and decides (Promoted, Rejected,
Deferred, ReviewRequested), versions the benchmark, and retires saturated scenarios; and the
sweeper (sweeps.py), which asks for the sweeps of a newly registered model version."""
