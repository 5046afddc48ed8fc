"""Reports rendered from the derived benchmark state (markdown; jinja2 keeps layout out of code)."""

from __future__ import annotations

from jinja2 import Environment

from consumers.benchmark_state import ModelScenarioScore, state_digest

TEMPLATE = """# SEPA-Eval report

State digest `{{ digest }}`

## Scores (success rate, 95% Wilson interval)

| model | scenario | episodes | success | 95% CI |
|---|---|---:|---:|---|
{% for s in scores -%}
{% set lo, hi = s.interval -%}
| {{ s.model_id }} | {{ s.scenario_id }} | {{ s.episodes }} | {{ "%.2f"|format(s.success_rate) }} \
| [{{ "%.2f"|format(lo) }}, {{ "%.2f"|format(hi) }}] |
{% endfor %}
## Benchmark

- active (promoted) scenarios: {{ state.active_scenarios|length }}
- open reviews: {{ state.open_reviews|length }}

## Evidence log

| table | events |
|---|---:|
{% for table, (count, _) in state.tables.items() -%}
| {{ table }} | {{ count }} |
{% endfor %}"""


def render_markdown(state: dict, scores: list[ModelScenarioScore]) -> str:
    template = Environment(autoescape=False, trim_blocks=False).from_string(TEMPLATE)
    return template.render(state=state, scores=scores, digest=state_digest(state))
