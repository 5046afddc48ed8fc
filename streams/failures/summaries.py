"""Short human summaries of failure clusters: from the centroid's features, or from a language model.

    describer = FeatureDescriber(EmbeddingConfig())
    dominant, text = describer.describe(stats)          # summary_source "features"

    llm = LlmSummarizer(client, model="gpt-4o-mini")   # any OpenAI-compatible client object
    text = llm.summarize(stats, feature_text=text)      # summary_source "llm"; raises SummaryError

The language-model hook never reads the environment: the caller builds the client (base URL, key)
at the edge and passes it in. ``summarize`` blocks on the network, so agents run it in an executor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streams.exceptions import SummaryError
from streams.failures.detector import FAILURE_TYPES
from streams.failures.embedding import EmbeddingConfig, decode, feature_names

# A type "often" co-occurs when this fraction of a cluster's episodes show it.
COOCCURS_FRACTION = 0.3
MAX_SUMMARY_CHARS = 400
# Types within this share of the most frequent one tie for dominant; the earliest wins.
DOMINANT_TIE_FRACTION = 0.1


@dataclass(frozen=True)
class ClusterStats:
    """What a summary may say about one macro cluster."""

    cluster_id: str
    size: int
    centroid: np.ndarray
    representative_episode_id: str
    representative_scenario_id: str
    top_scenarios: tuple[tuple[str, int], ...]  # (scenario_id, episodes), most first


class FeatureDescriber:
    """Dominant failure type and a one-line summary read off the centroid (failure embeddings)."""

    def __init__(self, embedding_config: EmbeddingConfig):
        self.embedding_config = embedding_config
        self.dims = len(feature_names())

    def describe(self, stats: ClusterStats) -> tuple[str, str]:
        if stats.centroid.shape != (self.dims,):
            return "unknown", f"{stats.size} failed episodes (embedding of {stats.centroid.shape[0]} dims)"
        f = decode(stats.centroid, self.embedding_config)
        share = sorted(((f[f"type:{t}"], t) for t in FAILURE_TYPES), reverse=True)
        if share[0][0] <= 0.0:
            return "none", f"{stats.size} failed episodes with no detected failure moment"
        # Among the (nearly) most frequent types, the earliest is the story's start: a timeout
        # accompanies most failures but comes last.
        timing = {t: f[f"when:{t}"] / s for s, t in share if s > 0}
        dominant = min((t for s, t in share if s >= share[0][0] - DOMINANT_TIE_FRACTION), key=lambda t: timing[t])
        top_share, when = f[f"type:{dominant}"], timing[dominant]
        share = [(top_share, dominant)] + [(s, t) for s, t in share if t != dominant]
        parts = [f"{stats.size} failed episodes, mostly {dominant} ({top_share:.0%}) "
                 f"at ~{when:.0%} of the episode"]
        also = [f"{t} ({s:.0%})" for s, t in share[1:] if s >= COOCCURS_FRACTION]
        if also:
            parts.append("often with " + ", ".join(also[:3]))
        cfg = self.embedding_config
        peak = f["force_peak"] * cfg.force_scale_n
        if peak > 0:
            parts.append(f"peak contact ~{peak:.0f} N")
        if f["scn_low_friction"] >= 0.25:
            parts.append(f"low-friction scenarios (~{10 ** (-2 * f['scn_low_friction']):.2f})")
        if f["scn_distractors"] > 0.0:
            parts.append(f"~{f['scn_distractors'] * 4:.1f} distractors")
        if abs(f["scn_size"]) >= 0.1:
            parts.append(f"object scaled x{1 + f['scn_size']:.2f}")
        if len(stats.top_scenarios) > 1:
            parts.append(f"{len(stats.top_scenarios)}+ scenarios")
        elif stats.top_scenarios:
            parts.append(f"scenario {stats.top_scenarios[0][0]}")
        return dominant, ("; ".join(parts))[:MAX_SUMMARY_CHARS]


class LlmSummarizer:
    """Optional: asks an OpenAI-compatible chat model for a one-sentence cluster summary.

    ``client`` is any object with ``chat.completions.create(model=..., messages=..., ...)``
    (``openai.OpenAI(base_url=..., api_key=...)`` built by the caller).
    """

    def __init__(self, client, model: str, max_tokens: int = 120, timeout_s: float = 30.0):
        if client is None or not model:
            raise SummaryError(f"LlmSummarizer needs a client and a model name, got {client!r}, {model!r}")
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s

    def summarize(self, stats: ClusterStats, feature_text: str) -> str:
        prompt = (f"A cluster of {stats.size} failed robot-manipulation episodes (robosuite, Panda arm). "
                  f"Feature summary: {feature_text}. Top scenarios: "
                  f"{', '.join(f'{s} ({n})' for s, n in stats.top_scenarios) or 'unknown'}. "
                  "Write one plain sentence (under 40 words) describing how these episodes fail, "
                  "for an engineer triaging them. Do not invent causes the features do not show.")
        try:
            reply = self.client.chat.completions.create(
                model=self.model, max_tokens=self.max_tokens, temperature=0.0, timeout=self.timeout_s,
                messages=[{"role": "system", "content": "You summarise robot failure clusters tersely."},
                          {"role": "user", "content": prompt}])
            text = (reply.choices[0].message.content or "").strip()
        except Exception as exc:  # any client or transport error: the caller keeps the feature summary
            raise SummaryError(f"cluster {stats.cluster_id}: model {self.model!r} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        if not text:
            raise SummaryError(f"cluster {stats.cluster_id}: model {self.model!r} returned an empty summary")
        return text[:MAX_SUMMARY_CHARS]
