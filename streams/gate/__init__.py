"""The promotion gate: joins each candidate's critic verdicts and decides (Promoted, Rejected,
Deferred, ReviewRequested), versions the benchmark, and retires saturated scenarios."""
