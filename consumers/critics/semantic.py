"""The semantic critic: a vision-language judge over a validation rollout's keyframes.

    judge = SemanticJudge(client, SemanticConfig(endpoint=..., model=...), KeyframeStore(root))
    verdict = judge.judge(task="lift the red cube", frames=[sha256, ...],        # one rollout, in order
                          models_under_evaluation=["scripted-fine", ...])
    verdict.fields()          # CriticVerdict fields but envelope and scenario_id

``client`` is an OpenAI-compatible client (``openai.OpenAI(base_url=..., api_key=...)``) built by
the caller at the edge, from ``SemanticConfig.endpoint`` and the key in the environment variable
``SemanticConfig.api_key_env``; this module reads no environment. With no endpoint (or no client)
the verdict says "not run": ran=false, backend "none", missing evidence for the gate.

How a score becomes a verdict (after the vlm-eval seed document):
- **Identify, then judge.** One prompt, used for the judgment and for the controls alike: first
  say what the frames show, then score the task against the rubric. The frames are the PNG files
  of the keyframe store, sent byte for byte (their sha256 is their name, re-checked on reading);
  at most ``max_frames``, evenly spaced with the first and the last.
- **Strict JSON.** The reply must be exactly one JSON object {"observation": str, "score": number
  in [0, 1], "reason": str, optionally "task_completed": bool}: no prose around it, no embedded
  JSON extracted, no duplicate keys (refused while parsing, by ``object_pairs_hook``), no extra
  keys, no coercion ("0.9" is not a number, true is not 1, 1.2 is not clamped). One complete
  object wrapped in a single ```json fence, and nothing else, is de-framed and recorded as such
  (parser ``strict-json-v1+markdown-fence-v1``).
- **Pass = score >= threshold**, the score rounded to 4 decimals; never the model's own boolean,
  which is kept as ``provider_success`` (with whether it agrees with the score's gate).
- **Negative controls.** When the judgment would pass, the same prompt is sent twice more: with
  uniform grey frames of the same sizes (blank), and with the real frames but an unrelated task.
  A judge that passes either control is not trusted: the verdict fails (ran=true, passed=false)
  with that reason. Controls can only take a pass away, so they are not run for a failing score.
- **A failed call is missing evidence, never a pass and never an exception**: timeout, connection
  or HTTP error, refusal, truncation (finish_reason length), content filter, any finish_reason but
  "stop", a served model other than the one requested (or one of ``served_model_aliases``),
  malformed JSON, prose around it, duplicate keys, wrong or missing or extra fields, a score out of
  range. The verdict is then ran=false, passed=null, score=null, reason "failed call (<kind>): ..."
  with the call's evidence; a failed control call likewise (the judge's trust was not
  established). The gate treats ran=false as missing (Deferred, retried later). Chosen over
  passed=false because none of these says anything about the candidate, and a rejection is final.
  Frames missing from (or corrupt in) the store are missing evidence too (no call is made).
- **Evidence per call**: role, sha256 and size of every frame sent, prompt / rubric / request-
  manifest hashes (the manifest holds no endpoint, key, path or image bytes), requested and served
  model, finish reason, latency, usage, provider request id, the sha256 of the exact response body
  and the reply text, the parser, the parsed fields or the failure.
- **Circular bias**: a judge whose model name matches a ``family_patterns`` regex that also matches
  a model under evaluation is flagged in the evidence and the reason (it does not change the pass).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import openai
from PIL import Image

from consumers.critics.exceptions import ConfigError, CriticInputError
from producers.keyframes import KeyframeStore

CRITIC = "semantic"
CRITIC_VERSION = "semantic-vlm/1.0"
BACKEND, BACKEND_NONE = "openai-compatible", "none"
PARSER = "strict-json-v1"
FENCED_PARSER = PARSER + "+markdown-fence-v1"
JUDGMENT, BLANK_CONTROL, UNRELATED_CONTROL = "judgment", "blank_control", "unrelated_control"
BLANK_GREY = 128  # the blank control's frames: uniform RGB (128, 128, 128), the real frames' sizes
MAX_REPLY_CHARS = 4000  # reply text kept in the evidence (its hash covers all of it)

DEFAULT_RUBRIC = (
    "Score 1.0 only when the frames clearly show the task completed. Score 0.0 when they clearly show it "
    "not done, or show something else: a blank or unreadable image, another scene, another task. Use values "
    "in between for visible partial progress. Lower the score for unsafe contact (the robot pressing or "
    "hitting things) and for outcomes the frames leave ambiguous. Judge only what is visible.")
# Model families: a judge and a model under evaluation matched by the same pattern are one family.
DEFAULT_FAMILIES = ("gpt-?[345]|o[134](-|$)|openai", "claude|anthropic", "gemini|gemma", "qwen", "llama|llava",
                    "mistral|pixtral", "deepseek", "internvl", "phi-?[34]", "cosmos|nemotron")
REPLY_KEYS = {"observation": str, "score": float, "reason": str}
OPTIONAL_KEYS = {"task_completed": bool}
_FENCE = re.compile(r"\A```json[ \t]*\r?\n(?P<body>.*)\r?\n```\Z", re.S)


@dataclass(frozen=True)
class SemanticConfig:
    """The judge: where, which model, how long to wait, and the claim (threshold and rubric)."""

    endpoint: str | None = None  # base URL of an OpenAI-compatible API; None = the critic does not run
    model: str | None = None
    api_key_env: str = "SEPA_JUDGE_API_KEY"  # the variable the edge reads the key from (never this module)
    timeout_s: float = 60.0  # per call
    max_retries: int = 0  # client retries per call; each may wait timeout_s again
    threshold: float = 0.8  # pass = round(score, 4) >= threshold
    rubric: str = DEFAULT_RUBRIC
    max_frames: int = 4
    family_patterns: tuple[str, ...] = DEFAULT_FAMILIES
    unrelated_task: str = "fold the blue towel in half on the kitchen counter"
    max_tokens: int = 400
    served_model_aliases: tuple[str, ...] = ()  # served names accepted besides ``model`` (exact strings)

    def __post_init__(self) -> None:
        if (self.endpoint is None) != (self.model is None):
            raise ConfigError(f"SemanticConfig needs both endpoint and model, or neither: "
                              f"endpoint={self.endpoint!r}, model={self.model!r}")
        for name in ("endpoint", "model"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(f"SemanticConfig.{name} must be a non-empty string or None, got {value!r}")
        if not isinstance(self.api_key_env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ConfigError(f"SemanticConfig.api_key_env must be an environment variable name, "
                              f"got {self.api_key_env!r}")
        if not isinstance(self.timeout_s, int | float) or not self.timeout_s > 0:
            raise ConfigError(f"SemanticConfig.timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"SemanticConfig.max_retries must be an int >= 0, got {self.max_retries!r}")
        if not isinstance(self.threshold, int | float) or not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"SemanticConfig.threshold must be in (0, 1], got {self.threshold!r}")
        if not isinstance(self.rubric, str) or not self.rubric.strip():
            raise ConfigError("SemanticConfig.rubric must be non-empty text")
        if not isinstance(self.max_frames, int) or self.max_frames < 1:
            raise ConfigError(f"SemanticConfig.max_frames must be an int >= 1, got {self.max_frames!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 16:
            raise ConfigError(f"SemanticConfig.max_tokens must be an int >= 16, got {self.max_tokens!r}")
        if not isinstance(self.unrelated_task, str) or not self.unrelated_task.strip():
            raise ConfigError("SemanticConfig.unrelated_task must be non-empty text")
        for pattern in self.family_patterns:
            try:
                re.compile(pattern)
            except (re.error, TypeError) as exc:
                raise ConfigError(f"SemanticConfig.family_patterns: {pattern!r} is not a regex: {exc}") from exc

    @property
    def configured(self) -> bool:
        return self.endpoint is not None


@dataclass
class CallRecord:
    """The evidence of one chat call (or of why none was made)."""

    role: str  # judgment | blank_control | unrelated_control
    task: str
    frames: list[dict]  # {sha256, width, height, bytes} of exactly what was sent, in order
    prompt_sha256: str
    rubric_sha256: str
    manifest_sha256: str
    requested_model: str
    served_model: str | None = None
    finish_reason: str | None = None
    latency_s: float | None = None
    usage: dict | None = None
    provider_request_id: str | None = None
    response_sha256: str | None = None
    reply: str | None = None
    reply_truncated: bool = False
    parser: str | None = None
    ok: bool = False
    failure: str | None = None  # kind, e.g. "timeout", "duplicate_keys"
    detail: str = ""
    score: float | None = None  # as served
    score_rounded: float | None = None
    observation: str | None = None
    reason: str | None = None
    provider_success: bool | None = None
    provider_success_matches_score_gate: bool | None = None


@dataclass(frozen=True)
class SemanticVerdict:
    ran: bool
    passed: bool | None
    score: float | None
    backend: str
    reason: str
    evidence: dict = field(default_factory=dict)

    def fields(self) -> dict:
        """CriticVerdict fields but envelope and scenario_id (the semantic critic requests no rollouts)."""
        return {"critic": CRITIC, "critic_version": CRITIC_VERSION, "ran": self.ran, "score": self.score,
                "passed": self.passed, "backend": self.backend, "reason": self.reason,
                "evidence_json": json.dumps(self.evidence, sort_keys=True, separators=(",", ":")), "rollouts": 0}


class ReplyError(ValueError):
    """A judge reply that is not a strict verdict; ``kind`` names how."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def parse_reply(text: str) -> tuple[dict, str]:
    """The verdict object of a reply and the parser that read it; raises ReplyError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ReplyError("empty", "the reply has no text")
    body, parser = text.strip(), PARSER
    if body.startswith("```"):
        fenced = _FENCE.match(body)
        if not fenced:
            raise ReplyError("prose_around_json", "a code fence that is not one complete ```json block")
        body, parser = fenced.group("body").strip(), FENCED_PARSER
    try:
        obj = json.loads(body, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except ReplyError:
        raise
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" or not body.startswith("{"):
            raise ReplyError("prose_around_json", f"text around the JSON object ({exc.msg} at char {exc.pos}); "
                                                  "embedded JSON is not extracted") from None
        raise ReplyError("malformed_json", f"{exc.msg} at char {exc.pos}") from None
    if not isinstance(obj, dict):
        raise ReplyError("not_an_object", f"the reply is a JSON {type(obj).__name__}, not an object")
    missing = sorted(set(REPLY_KEYS) - set(obj))
    if missing:
        raise ReplyError("missing_keys", f"missing {', '.join(missing)}")
    extra = sorted(set(obj) - set(REPLY_KEYS) - set(OPTIONAL_KEYS))
    if extra:
        raise ReplyError("unexpected_keys", f"unexpected {', '.join(extra)}")
    for key, kind in (REPLY_KEYS | OPTIONAL_KEYS).items():
        if key not in obj:
            continue
        value = obj[key]
        ok = (isinstance(value, int | float) and not isinstance(value, bool)) if kind is float else \
            isinstance(value, kind)
        if not ok:
            raise ReplyError("wrong_types", f"{key} must be {'a number' if kind is float else kind.__name__}, "
                                            f"got {json.dumps(value)}")
    score = obj["score"]
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise ReplyError("score_out_of_range", f"score {score!r} is not in [0, 1]")
    return obj, parser


class _FrameUnavailable(Exception):
    """A keyframe the store cannot give back as sent (missing, corrupt, not PNG)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise ReplyError("duplicate_keys", f"key {key!r} appears twice")
        seen[key] = value
    return seen


def _no_constants(name: str) -> Any:
    raise ReplyError("malformed_json", f"{name} is not JSON")


def circular_bias(judge_model: str, models: Sequence[str], patterns: Sequence[str]) -> dict:
    """{"flagged", "family", "models"}: the first family pattern the judge shares with evaluated models."""
    for pattern in patterns:
        if re.search(pattern, judge_model, re.I):
            same = sorted(m for m in models if re.search(pattern, m, re.I))
            if same:
                return {"flagged": True, "family": pattern, "models": same}
    return {"flagged": False, "family": None, "models": []}


def select_frames(count: int, limit: int) -> list[int]:
    """Indices of at most ``limit`` of ``count`` frames, evenly spaced, the first and the last included."""
    if count <= limit:
        return list(range(count))
    if limit == 1:
        return [count - 1]
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


def sha256_hex(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class SemanticJudge:
    """Judges one rollout's keyframes against a task; every outcome is a SemanticVerdict, never an exception.

    ``clock`` (seconds, monotonic) times the calls.
    """

    def __init__(self, client: Any, config: SemanticConfig, keyframes: KeyframeStore,
                 clock: Callable[[], float] = time.perf_counter):
        self.client = client
        self.config = config
        self.keyframes = keyframes
        self.clock = clock

    # -- prompt ----------------------------------------------------------------------------------
    def system_text(self) -> str:
        return ("You judge robot manipulation rollouts from camera frames. You describe what you see before "
                "you judge it, and you answer with exactly one JSON object and nothing else.")

    def user_text(self, task: str, frames: int) -> str:
        return (
            f"You are shown {frames} frame(s) of one robot rollout, in time order, first to last.\n"
            "Step 1, identify: say what the frames actually show: the scene, the objects, the robot, and what "
            "changes from the first frame to the last. Do not assume that any task was attempted.\n"
            "Step 2, judge: only then score how far the frames show this task completed.\n"
            f"Task: {json.dumps(task)}\n"
            f"Rubric: {self.config.rubric}\n"
            "Answer with exactly one JSON object with these keys and nothing else:\n"
            '{"observation": "<what the frames show>", "task_completed": <true or false>, '
            '"score": <a number from 0 to 1>, "reason": "<why this score>"}')

    # -- the verdict -----------------------------------------------------------------------------
    def judge(self, task: str, frames: Sequence[str], models_under_evaluation: Sequence[str] = ()) -> SemanticVerdict:
        cfg = self.config
        if not isinstance(task, str) or not task.strip():
            raise CriticInputError(f"the semantic judge needs the task's instruction, got {task!r}")
        if isinstance(frames, str) or not all(isinstance(f, str) for f in frames):
            raise CriticInputError("frames must be a sequence of keyframe sha256 strings, in episode order")
        evidence: dict = {"rule": CRITIC_VERSION, "threshold": cfg.threshold, "rubric_sha256": sha256_hex(cfg.rubric),
                          "max_frames": cfg.max_frames, "judge_model": cfg.model}
        if not cfg.configured or self.client is None:
            why = "no judge endpoint configured" if not cfg.configured else "no client built for the judge endpoint"
            return SemanticVerdict(False, None, None, BACKEND_NONE, f"not run: {why}", evidence)
        bias = circular_bias(cfg.model, list(models_under_evaluation), cfg.family_patterns)
        evidence["circular_bias"] = bias
        flag = (f"; circular bias: judge {cfg.model!r} is of family /{bias['family']}/ like "
                f"{', '.join(bias['models'])}") if bias["flagged"] else ""

        picked = select_frames(len(frames), cfg.max_frames)
        evidence["sampling"] = {"strategy": "keyframes-even", "available": len(frames), "selected": picked,
                                "coverage_complete": len(frames) <= cfg.max_frames}
        if not picked:
            return SemanticVerdict(False, None, None, BACKEND, "not run: the rollout has no keyframes" + flag, evidence)
        try:
            images = [self._frame(frames[i]) for i in picked]
        except _FrameUnavailable as exc:  # the store, not the judge: no call was made
            return SemanticVerdict(False, None, None, BACKEND, f"not run: {exc}" + flag, evidence)

        calls: list[CallRecord] = []
        evidence["calls"] = calls
        main = self._call(JUDGMENT, task, images)
        calls.append(main)
        if not main.ok:
            return self._done(False, None, None, f"failed call ({main.failure}): {main.detail}" + flag, evidence)
        score = main.score_rounded
        if score < cfg.threshold:
            return self._done(True, False, score, f"score {score:.4f} < threshold {cfg.threshold} "
                                                  f"(controls not run: they can only take a pass away){flag}",
                              evidence)
        blank = [(_blank_png(w, h), w, h) for _, w, h in images]
        for role, t, imgs in ((BLANK_CONTROL, task, blank), (UNRELATED_CONTROL, cfg.unrelated_task, images)):
            record = self._call(role, t, imgs)
            calls.append(record)
            if not record.ok:
                return self._done(False, None, None, f"failed call ({record.failure}) on the {role.replace('_', ' ')}:"
                                                     f" {record.detail}; the judge's trust was not established"
                                                     + flag, evidence)
        passed_controls = [c for c in calls[1:] if c.score_rounded >= cfg.threshold]
        if passed_controls:
            return self._done(True, False, score, "judge not trusted: " + "; ".join(
                f"the {c.role.replace('_', ' ')} scored {c.score_rounded:.4f} >= {cfg.threshold}"
                for c in passed_controls) + f" (judgment {score:.4f})" + flag, evidence)
        return self._done(True, True, score, f"score {score:.4f} >= threshold {cfg.threshold}; controls "
                                             f"{calls[1].score_rounded:.4f} (blank), {calls[2].score_rounded:.4f} "
                                             f"(unrelated task) below it{flag}", evidence)

    @staticmethod
    def _done(ran: bool, passed: bool | None, score: float | None, reason: str, evidence: dict) -> SemanticVerdict:
        evidence = evidence | {"calls": [asdict(c) for c in evidence["calls"]]}
        return SemanticVerdict(ran, passed, score, BACKEND, reason, evidence)

    def _frame(self, sha256: str) -> tuple[bytes, int, int]:
        path = self.keyframes.path_for(sha256)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise _FrameUnavailable(f"keyframe {sha256} is not in the store ({exc.strerror})") from None
        if sha256_hex(data) != sha256:
            raise _FrameUnavailable(f"keyframe {sha256}'s file is corrupt: it hashes to {sha256_hex(data)}")
        try:
            with Image.open(io.BytesIO(data)) as img:
                fmt, (width, height) = img.format, img.size
        except (OSError, Image.DecompressionBombError) as exc:
            raise _FrameUnavailable(f"keyframe {sha256} is not a readable image: {exc}") from None
        if fmt != "PNG":
            raise _FrameUnavailable(f"keyframe {sha256} is {fmt}, not PNG")
        return data, width, height

    # -- one call --------------------------------------------------------------------------------
    def _call(self, role: str, task: str, images: list[tuple[bytes, int, int]]) -> CallRecord:
        cfg = self.config
        system, user = self.system_text(), self.user_text(task, len(images))
        sent = [{"sha256": sha256_hex(d), "width": w, "height": h, "bytes": len(d)} for d, w, h in images]
        prompt_sha = sha256_hex(_canonical([system, user]))
        manifest = {"model": cfg.model, "max_tokens": cfg.max_tokens, "temperature": 0.0, "prompt_sha256": prompt_sha,
                    "rubric_sha256": sha256_hex(cfg.rubric), "frames": [f["sha256"] for f in sent], "role": role}
        record = CallRecord(role, task, sent, prompt_sha, sha256_hex(cfg.rubric), sha256_hex(_canonical(manifest)),
                            cfg.model)
        content: list[dict] = [{"type": "text", "text": user}]
        content += [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(d).decode()}}
                    for d, _, _ in images]
        messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
        started = self.clock()
        try:
            client = self.client.with_options(max_retries=cfg.max_retries) \
                if hasattr(self.client, "with_options") else self.client
            raw = client.chat.completions.with_raw_response.create(
                model=cfg.model, messages=messages, max_tokens=cfg.max_tokens, temperature=0.0,
                timeout=cfg.timeout_s)
            body = raw.content
            record.provider_request_id = raw.headers.get("x-request-id")
        except Exception as exc:  # every client, transport or HTTP failure is a failed call, recorded
            record.latency_s = round(self.clock() - started, 6)
            return _failed(record, *_call_failure(exc, cfg.timeout_s))
        record.latency_s = round(self.clock() - started, 6)
        record.response_sha256 = sha256_hex(body)
        try:
            self._read_response(record, body)
        except ReplyError as exc:
            return _failed(record, exc.kind, exc.detail)
        record.ok = True
        return record

    def _read_response(self, record: CallRecord, body: bytes) -> None:
        cfg = self.config
        try:
            payload = json.loads(body)
            choice = payload["choices"][0]
            message = choice["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ReplyError("bad_response", f"not a chat completion ({type(exc).__name__}: {exc})") from None
        record.served_model = payload.get("model")
        record.finish_reason = choice.get("finish_reason")
        record.usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else None
        if record.provider_request_id is None and isinstance(payload.get("id"), str):
            record.provider_request_id = payload["id"]
        text = message.get("content")
        if isinstance(text, str):
            record.reply, record.reply_truncated = text[:MAX_REPLY_CHARS], len(text) > MAX_REPLY_CHARS
        refusal = message.get("refusal")
        if refusal:
            raise ReplyError("refusal", f"the judge refused: {str(refusal)[:200]}")
        if record.finish_reason == "length":
            raise ReplyError("truncated", f"finish_reason length: the reply was cut at max_tokens={cfg.max_tokens}")
        if record.finish_reason == "content_filter":
            raise ReplyError("content_filter", "finish_reason content_filter: the provider filtered the reply")
        if record.finish_reason != "stop":
            raise ReplyError("finish_reason", f"finish_reason {record.finish_reason!r}, not 'stop'")
        if record.served_model != cfg.model and record.served_model not in cfg.served_model_aliases:
            raise ReplyError("served_model_mismatch", f"asked for {cfg.model!r}, served {record.served_model!r}")
        obj, record.parser = parse_reply(text)
        record.score = obj["score"]
        record.score_rounded = round(float(obj["score"]), 4)
        record.observation, record.reason = obj["observation"], obj["reason"]
        if "task_completed" in obj:
            record.provider_success = obj["task_completed"]
            gate = record.score_rounded >= cfg.threshold
            record.provider_success_matches_score_gate = obj["task_completed"] == gate


def _failed(record: CallRecord, kind: str, detail: str) -> CallRecord:
    record.ok, record.failure, record.detail = False, kind, detail
    return record


def _call_failure(exc: Exception, timeout_s: float) -> tuple[str, str]:
    if isinstance(exc, openai.APITimeoutError):
        return "timeout", f"no answer within {timeout_s} s"
    if isinstance(exc, openai.APIConnectionError):
        return "connection", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, openai.APIStatusError):
        return "http_status", f"HTTP {exc.status_code}: {str(exc)[:300]}"
    return "client_error", f"{type(exc).__name__}: {str(exc)[:300]}"


def _blank_png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (BLANK_GREY,) * 3).save(buf, format="PNG", optimize=False)
    return buf.getvalue()
