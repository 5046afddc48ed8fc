"""Generate: mutation operators (operators.py) and their choice from failure clusters, the blind
baseline, compositions and the feasibility pre-check (chooser.py). Pure; the faust agent that
answers CycleStarted with CandidatesGenerated is wired separately."""
