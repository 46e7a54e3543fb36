"""``recjudge judge tune``: LoRA on a team's own log, merged into a folder every backend loads.

TALLRec (Bao et al., RecSys 2023) showed a prompted LLM near AUC 0.5 on MovieLens relevance and
the same LLM LoRA-tuned on a few hundred of the domain's yes/no examples well above it. This
module does that for the judge as it runs: the BRIEF prompt exactly as ``Judge.prompt_ids``
renders it, and the evidence-first answer the grammar allows as the target
(``tune._pairs``: pairs from the log only, the evidence rule, the negatives).

Training: LoRA (Hu et al. 2022, through ``peft``) on the attention projections, the causal LM
loss on the answer's tokens only (the prompt is context; the LM head runs only at the positions
that predict them, ``training_loss``), plus, with ``decision_weight``, a
logistic loss on the decision margin ``s`` below (``decision_loss``), AdamW with a linear
warm-up and decay, padded micro-batches, on CPU or CUDA. Every ``eval_every`` steps the
validation users' pairs are scored teacher-forced at the decision, in fp32: ``s = logit(YES
token) - logit(NO token)`` at the first answer token where the YES and NO answers differ (the
step where the grammar's bias acts); their AUC decides early stopping (``patience`` evaluations
without improvement) and which adapter is kept. A checkpoint (adapter, optimizer moments, step,
history; all safetensors / JSON, nothing pickled) is written at each evaluation, and ``resume``
continues from it. The best adapter is merged into the base weights and saved as a plain
safetensors folder with the base's tokenizer files and a card (``llm._card``) whose digest
enters every result key; the grammar and the CF bias apply on top, as for any model.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from recjudge._stats import auc
from recjudge._tune_config import TUNE_VERSION, TuneConfig
from recjudge._util import (
    atomic_dir,
    atomic_write_bytes,
    atomic_write_json,
    first_line,
    json_loads,
    release_freed_memory,
    sha256_file,
    stable_hash,
    torch_seeded,
)
from recjudge.data import describe_suspicious, suspicious_items, suspicious_summary
from recjudge.decoding import GRAMMARS, json_literal
from recjudge.llm import (
    PRESETS,
    TUNED_CARD,
    TUNED_FORMAT,
    USERS_FILE,
    LLMConfig,
    card_digest,
    load_llm,
    quiet_loading,
    require_device,
    resolve_model_path,
    sign_card,
    user_hash,
)
from recjudge.reward import Judge, JudgeConfig
from recjudge.tune._pairs import EvidenceRule, TunePair, TunePairs, build_pairs

__all__ = ["TUNE_VERSION", "TuneConfig", "TuneResult", "tune"]

STATE = "state.json"
LORA_FILE = "lora.safetensors"
BEST_FILE = "best.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"


@dataclass
class Example:
    """One tokenised pair: prompt + target answer, and the decision for validation."""

    ids: list[int]
    prompt_len: int
    label: int
    prefix_len: int  # the history's prefix, shared by every pair of its user (validation)
    decision_at: int  # index in ``ids`` of the first token where YES and NO answers differ
    yes_token: int  # the YES target's token there
    no_token: int  # the NO target's token there
    #: every token that commits the answer to YES / NO there (``branch_tokens``): the
    #: read-out's P(YES) is the mass of the first set against the second's
    yes_tokens: tuple[int, ...]
    no_tokens: tuple[int, ...]


def answer_text(titles: Sequence[str]) -> str:
    """The evidence-first answer the grammar allows: YES with ``titles``, NO without."""
    if not titles:
        return '{"evidence": [], "is_relevant": "NO"}'
    return '{"evidence": [' + ", ".join(json_literal(t) for t in titles) + \
        '], "is_relevant": "YES"}'  # fmt: skip


def encode_pair(judge: Any, pair: TunePair, rule: EvidenceRule) -> Example:
    """``pair`` as the judge prompts it, with its target answer (checked by the grammar's
    parser) and the decision tokens."""
    rendered, prefix, suffix = judge.prompt_ids(pair.request)
    schema = judge.config.schema_for(rendered)
    shown = [h.item_id for h in rendered.shown]
    by_id = {h.item_id: h.title for h in rendered.shown}
    cited = [by_id[i] for i in rule.choose(pair.request.candidate_id, shown)]
    cited = cited[: judge.config.max_evidence]
    yes, no = answer_text(cited), answer_text([])
    for text in (yes, no):
        schema.parse(text)  # the target is an answer the grammar allows (raises otherwise)
    yes_ids, no_ids = judge.llm.encode(yes), judge.llm.encode(no)
    common = 0
    while common < min(len(yes_ids), len(no_ids)) - 1 and yes_ids[common] == no_ids[common]:
        common += 1
    prompt = list(prefix) + list(suffix)
    target = yes_ids if pair.label else no_ids
    yes_set, no_set = branch_tokens(schema.decision(), judge.llm.tokenizer, tuple(yes_ids[:common]))
    if yes_ids[common] not in yes_set or no_ids[common] not in no_set:
        raise ValueError(f"the answer's decision tokens ({yes_ids[common]}, {no_ids[common]}) "
                         "are not among the tokens that commit to YES / NO")  # fmt: skip
    return Example(
        ids=prompt + list(target),
        prompt_len=len(prompt),
        label=pair.label,
        prefix_len=len(prefix),
        decision_at=len(prompt) + common,
        yes_token=yes_ids[common],
        no_token=no_ids[common],
        yes_tokens=yes_set,
        no_tokens=no_set,
    )


@functools.lru_cache(maxsize=32)
def branch_tokens(
    spec: Any, tokenizer: Any, before: tuple[int, ...]
) -> tuple[tuple[int, ...], ...]:
    """The tokens that, after the answer's tokens ``before`` (which commit to neither branch),
    commit the answer to each branch of ``spec`` (the schema's ``DecisionSpec``: for
    evidence-first, YES a non-empty evidence list, NO an empty one).

    These are the classes the grammar's decision step compares (``DecisionSpec.
    committing_tokens`` over the grammar's token table, the bias processor's own rule: P(YES)
    is the softmax mass of the YES tokens against the NO tokens), so a score or loss over them
    is the read-out's own: the target's single token alone (``" [\""`` vs ``" [],"`` for
    SmolLM2) leaves out ``" []"`` and ``" [])"``, whose mass the read-out counts and a tuning
    on the target tokens never trains.
    """
    token_bytes = GRAMMARS.table(tokenizer).token_bytes
    return spec.committing_tokens(token_bytes, b"".join(token_bytes[t] for t in before))


# -- the model ---------------------------------------------------------------------------------
def base_folder(model: str) -> Path:
    path = resolve_model_path(model)
    if not isinstance(path, Path) or not path.is_dir():
        raise ValueError(f"--model {model!r}: tuning needs a local model folder or a preset "
                         "(a hub id is not downloaded here)")  # fmt: skip
    return path


def base_digest(model: str) -> str:
    """The base model's identity: a preset's GGUF sha256, a tuned folder's card digest, else
    the sha256 of the folder's weight files' digests."""
    if model in PRESETS:
        return PRESETS.get(model).sha256
    folder = base_folder(model)
    tuned = card_digest(folder)
    if tuned:
        return tuned
    files = sorted(folder.glob("*.safetensors"))
    return stable_hash([(f.name, sha256_file(f)) for f in files], length=64)


def load_trainable(config: TuneConfig, device: str) -> Any:
    """The base model in fp32 with a fresh LoRA adapter (``peft``)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    with quiet_loading():
        base = AutoModelForCausalLM.from_pretrained(base_folder(config.model),
                                                    dtype=torch.float32)  # fmt: skip
    lora = LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                      target_modules=list(config.target_modules), bias="none",
                      task_type="CAUSAL_LM")  # fmt: skip
    try:
        with torch_seeded(config.seed):  # the adapter's initial A matrices: the same every run
            model = get_peft_model(base, lora)
    except ValueError as e:  # e.g. a target module this architecture does not have
        have = sorted({n.rsplit(".", 1)[-1] for n, m in base.named_modules()
                       if isinstance(m, torch.nn.Linear)})  # fmt: skip
        raise ValueError(f"--target-modules {','.join(config.target_modules)}: "
                         f"{first_line(e, 200)}; this model's linear layers are "
                         f"{','.join(have)}") from None  # fmt: skip
    return model.to(device)


def _batch(examples: Sequence[Example], pad: int, device: str, upto: str) -> tuple[Any, ...]:
    """Right-padded ids, attention mask and labels (-100 on prompt and padding) of a
    micro-batch; ``upto="decision"`` cuts each sequence at its decision token."""
    import torch

    seqs = [e.ids[: e.decision_at] if upto == "decision" else e.ids for e in examples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long, device=device)
    for n, (e, s) in enumerate(zip(examples, seqs, strict=True)):
        ids[n, : len(s)] = torch.tensor(s, dtype=torch.long, device=device)
        mask[n, : len(s)] = 1
        labels[n, e.prompt_len : len(s)] = ids[n, e.prompt_len : len(s)]
    return ids, mask, labels


def decision_scores(model: Any, examples: Sequence[Example], pad: int, device: str,
                    batch: int = 8) -> list[float]:  # fmt: skip
    """Teacher-forced decision margin at each example's decision token: ``logsumexp`` of the
    logits of the tokens that commit to YES minus that of those that commit to NO
    (``_margin``, the read-out's ``logit P(YES)`` at that step).

    The examples that share a history prefix (a user's pairs) run it once: the prefix's
    key/value cache is repeated over up to ``batch`` of them and only their suffixes
    (candidate and the answer up to the decision) are run on it, right-padded. The scores
    are those of whole sequences up to floating-point rounding (a validation set of 6 pairs
    a user runs about 5x fewer tokens).

    Always in fp32, whatever autocast is active: the score is a small difference of two
    logits, and bf16 rounding moves it by as much as the pairs differ (SmolLM2 on 300 ML-1M
    validation pairs: scores' sd 0.15, the same pairs batched 1 or 4 at a time differed by up
    to 0.375 and gave AUC 0.477 vs 0.502), which made early stopping pick noise."""
    import torch

    groups: dict[tuple[int, ...], list[int]] = {}
    cut = [min(max(e.prefix_len, 1), e.decision_at - 1) for e in examples]  # a tail to run
    for n, e in enumerate(examples):
        groups.setdefault(tuple(e.ids[: cut[n]]), []).append(n)
    out: list[float] = [0.0] * len(examples)
    model.eval()
    with torch.no_grad(), torch.autocast(device.split(":")[0], enabled=False):
        for prefix, members in groups.items():
            head = torch.tensor([list(prefix)], dtype=torch.long, device=device)
            cached = model(input_ids=head, use_cache=True).past_key_values
            for b in range(0, len(members), batch):
                part = [examples[n] for n in members[b : b + batch]]
                past = copy.deepcopy(cached)
                past.batch_repeat_interleave(len(part))
                tails = [e.ids[len(prefix) : e.decision_at] for e in part]
                width = max(len(t) for t in tails)
                ids = torch.full((len(part), width), pad, dtype=torch.long, device=device)
                mask = torch.zeros((len(part), len(prefix) + width), dtype=torch.long,
                                   device=device)  # fmt: skip
                mask[:, : len(prefix)] = 1
                for k, t in enumerate(tails):
                    ids[k, : len(t)] = torch.tensor(t, dtype=torch.long, device=device)
                    mask[k, len(prefix) : len(prefix) + len(t)] = 1
                # the LM head at each row's last real token only (not over every position)
                at = torch.tensor([[len(t) - 1] for t in tails], device=device)
                logits = model(input_ids=ids, attention_mask=mask, past_key_values=past,
                               logits_to_keep=at).logits  # fmt: skip
                for k, (n, e) in enumerate(zip(members[b : b + batch], part, strict=True)):
                    out[n] = float(_margin(logits[k, 0].float(), e))
    return out


def _margin(row: Any, e: Example) -> Any:
    """The decision margin of one logits row: ``logsumexp`` of the YES tokens' logits minus
    that of the NO tokens' (``branch_tokens``), i.e. the read-out's ``logit P(YES)``."""
    import torch

    yes = torch.tensor(e.yes_tokens, device=row.device)
    no = torch.tensor(e.no_tokens, device=row.device)
    return torch.logsumexp(row[yes], 0) - torch.logsumexp(row[no], 0)


def decision_loss(rows: Sequence[Any], batch: Sequence[Example]) -> Any:
    """``mean softplus(-(2y - 1) * m)`` with ``m = logsumexp(YES tokens) - logsumexp(NO
    tokens)`` at each example's decision token (``rows[n]``: example ``n``'s logits at the
    position before its decision token): the logistic loss of the margin
    ``decision_scores`` measures, in fp32."""
    import torch

    margin = torch.stack([_margin(r.float(), e) for r, e in zip(rows, batch, strict=True)])
    sign = torch.tensor([2.0 * e.label - 1.0 for e in batch], device=margin.device)
    return torch.nn.functional.softplus(-sign * margin).mean()


def training_loss(model: Any, batch: Sequence[Example], pad: int, device: str,
                  decision_weight: float, precision: str) -> Any:  # fmt: skip
    """One micro-batch's loss: the causal LM loss on the answers' tokens (mean over them, as
    transformers' ``labels`` loss) plus ``decision_weight`` times ``decision_loss``, in fp32.

    The LM head runs only at the positions that predict an answer token (``logits_to_keep``
    as a boolean mask; each row's decision position is among them), not at every prompt
    position: the prompt is ~95 % of a pair's tokens (ML-1M, 10-item histories, the 0.5B's
    tokenizer: 396 of 417), and a head over a 150k vocabulary at every position took ~30 % of
    the 0.5B's step time and ~4.4 GB of its peak memory (a ``[4, ~420, 151,936]`` fp32 logits
    tensor and its gradient). The loss is the same up to floating-point rounding (tests:
    against the full-logits loss and its gradients)."""
    import torch

    ids, mask, labels = _batch(batch, pad, device, "all")
    answer = labels[:, 1:] != -100  # position p predicts the answer token at p + 1
    keep = torch.cat([answer, answer.new_zeros((len(batch), 1))], dim=1)
    with _autocast(device, precision):
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep).logits
    if logits.dim() == 3:  # a model that ignored logits_to_keep: the same rows, from all
        logits = logits[keep]
    logits = logits.float()  # [answer positions of every row, in row order, vocab]
    loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:][answer])
    if decision_weight:
        first = np.cumsum([0] + [len(e.ids) - e.prompt_len for e in batch])
        rows = [logits[int(first[n]) + e.decision_at - e.prompt_len] for n, e in enumerate(batch)]
        loss = loss + decision_weight * decision_loss(rows, batch)
    return loss


def validation_auc(model: Any, examples: Sequence[Example], pad: int, device: str) -> float | None:
    """AUC of the decision scores against the validation labels (Mann-Whitney)."""
    s = decision_scores(model, examples, pad, device)
    pos = [v for v, e in zip(s, examples, strict=True) if e.label]
    neg = [v for v, e in zip(s, examples, strict=True) if not e.label]
    return auc(pos, neg)


def learning_rate(config: TuneConfig, step: int) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then linear decay to 0 at ``steps``."""
    if config.warmup and step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    span = max(1, config.steps - config.warmup)
    return config.lr * max(0.0, 1.0 - (step - config.warmup) / span)


def order_of(n: int, config: TuneConfig, step: int) -> list[int]:
    """The training examples of optimiser step ``step``: epoch ``e``'s seeded permutation,
    so a resumed run takes exactly the examples the uninterrupted one would."""
    per = config.batch_size
    out = []
    for k in range(step * per, (step + 1) * per):
        epoch, at = divmod(k, n)
        out.append(int(_permutation(n, config.seed, epoch)[at]))
    return out


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def used_examples(n: int, config: TuneConfig, steps: int | None = None) -> list[int]:
    """The training pairs that the first ``steps`` (default ``config.steps``) optimiser steps
    read, in order of first use: only those of ``config.steps`` are rendered and tokenised (a
    log of 6,000 users gives ~36,000 pairs, of which 60 steps of 4 read 240), and the card
    counts those of the steps that ran."""
    seen: dict[int, None] = {}
    for step in range(config.steps if steps is None else steps):
        for i in order_of(n, config, step):
            seen.setdefault(i)
    return list(seen)


# -- checkpoints (safetensors + JSON; nothing pickled) -------------------------------------------
def _lora_state(model: Any) -> dict[str, Any]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}


def _write_tensors(path: Path, tensors: dict[str, Any]) -> None:
    """``tensors`` as a safetensors file, written to a temp name and renamed."""
    from safetensors.torch import save

    atomic_write_bytes(path, save(tensors))


def set_lora(model: Any, path: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(path)))


def save_checkpoint(work: Path, model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """Adapter, AdamW moments and the loop's state, each file written then renamed; the
    state file (last) names a complete checkpoint."""
    _write_tensors(work / LORA_FILE, _lora_state(model))
    tensors: dict[str, Any] = {}
    for i, st in optimizer.state_dict()["state"].items():
        for name, value in st.items():
            tensors[f"{i}.{name}"] = value.detach().cpu().contiguous().reshape(value.shape)
    _write_tensors(work / OPTIMIZER_FILE, tensors)
    atomic_write_json(work / STATE, state)


def check_resumable(work: Path, config: Any) -> None:
    """Refuse ``--resume`` of a checkpoint made under other settings, naming each option that
    differs with its saved and its current value (not the whole config).

    Raises:
        ValueError: the options that differ, and what to do.
    """
    path = work / STATE
    if not path.is_file():
        return
    try:
        state = json_loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return  # load_checkpoint says what is wrong with it
    saved = state.get("config") if isinstance(state, dict) else None
    if not isinstance(saved, dict) or state.get("fingerprint") == config.fingerprint():
        return
    now = config.model_dump(mode="json")
    diff = [f"--{k.replace('_', '-')} {saved.get(k)!r} in the checkpoint, {now.get(k)!r} now"
            for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]  # fmt: skip
    if diff:
        raise ValueError(f"{work} holds a tuning checkpoint made with other settings: "
                         + "; ".join(diff) + ". Resume with the checkpoint's values, or "
                         "choose another --out")  # fmt: skip


def load_checkpoint(work: Path, model: Any, optimizer: Any, fingerprint: str) -> dict | None:
    """The state of ``work``'s checkpoint, its adapter and moments loaded (None: none yet).

    Raises:
        ValueError: the checkpoint was made under other settings (named).
    """
    import torch
    from safetensors.torch import load_file

    path = work / STATE
    if not path.is_file():
        return None
    state = json_loads(path.read_text(encoding="utf-8"))
    if state.get("fingerprint") != fingerprint:
        raise ValueError(f"{work} holds a tuning checkpoint made with other settings; resume "
                         "with those, or choose another --out")  # fmt: skip
    set_lora(model, work / LORA_FILE)
    flat = load_file(str(work / OPTIMIZER_FILE))
    moments: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        i, _, name = key.partition(".")
        moments.setdefault(int(i), {})[name] = value
    sd = optimizer.state_dict()
    sd["state"] = {i: {k: (v if k != "step" else v.to(torch.float32)) for k, v in st.items()}
                   for i, st in moments.items()}  # fmt: skip
    optimizer.load_state_dict(sd)
    return state


# -- the run ------------------------------------------------------------------------------------
@dataclass
class TuneResult:
    """What a tuning run produced (also in the card)."""

    out: Path
    card: dict[str, Any]


def _users_record(pairs: TunePairs) -> dict[str, Any]:
    """The users the tuning read (sha256 of each id, never the id) with the latest timestamp
    read for each, and the validation users: what ``evaluate``'s leakage check reads."""
    return {
        "format": "recjudge-tuning-users",
        "hash": "sha256(user_id)[:16]",
        "last_time": {user_hash(u): t for u, t in sorted(pairs.users_last_time.items())},
        "validation": sorted(user_hash(u) for u in pairs.validation_users),
    }


def encode_examples(judge: Any, pairs: Sequence[TunePair], rule: EvidenceRule, skipped: list[str],
              which: Sequence[int] | None = None) -> dict[int, Example]:  # fmt: skip
    """The pairs at ``which`` (default all) encoded, by index; a pair that cannot be encoded
    is left out and named in ``skipped``."""
    out: dict[int, Example] = {}
    for i in range(len(pairs)) if which is None else which:
        p = pairs[i]
        try:
            out[i] = encode_pair(judge, p, rule)
        except (ValueError, KeyError, IndexError) as e:  # one bad record never ends the run
            skipped.append(f"{p.request.user_id}/{p.request.candidate_id}: {e}")
    return out


def tune(
    config: TuneConfig,
    data: Any,
    out: str | Path,
    *,
    exclude_users: Sequence[str] = (),
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """Tune ``config.model`` on ``data`` and write the merged folder to ``out``.

    Args:
        config: the tuning settings.
        data: the team's log (``recjudge.data.Dataset``): the past only.
        out: the merged model folder; its checkpoints go to ``OUT.tune/``.
        exclude_users: users the tuning never reads (those to be evaluated or labelled).
        resume: continue the checkpoint in ``OUT.tune/`` (refused when its settings differ).
        progress: a progress bar with ETA.
        log: where one-line notes go (skipped pairs, early stop).

    Raises:
        ValueError: bad settings or data (one line naming the fix), ``out`` already there.
    """
    import torch

    log = log or (lambda m: None)
    out = Path(out)
    work = Path(f"{out}.tune")
    if out.exists():
        raise ValueError(f"{out} exists; choose another --out (a tuned folder is never "
                         "overwritten)")  # fmt: skip
    if work.exists() and not resume and (work / STATE).exists():
        raise ValueError(f"{work} holds a tuning checkpoint; pass --resume to continue it, or "
                         "choose another --out")  # fmt: skip
    if resume:  # before the model loads: names the options that differ
        check_resumable(work, config)
    device = require_device(LLMConfig(device=config.device).resolved_device())
    t0 = time.perf_counter()
    pairs, train, val, pad, skipped = _prepared(config, data, exclude_users, log)
    flagged = suspicious_training(data, pairs, list(train))
    if flagged["items"]:  # a catalogue's text can carry a trigger into the tuned weights
        log(f"tune: {describe_suspicious(flagged)}; {flagged['training_pairs']} of the "
            f"{len(train)} training pairs show them (as data, rendered like every title); "
            "review them with `recjudge audit`, or remove those items before tuning")  # fmt: skip
    model = load_trainable(config, device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    fp = config.fingerprint()
    state = load_checkpoint(work, model, optimizer, fp) if resume else None
    if state is None:
        auc0 = validation_auc(model, val, pad, device)
        state = {"fingerprint": fp, "config": config.model_dump(mode="json"), "step": 0,
                 "history": [{"step": 0, "val_auc": auc0, "loss": None}], "best_step": 0,
                 "best_auc": auc0, "bad_evals": 0, "stopped": None, "seconds": 0.0}  # fmt: skip
        _write_tensors(work / BEST_FILE, _lora_state(model))
        save_checkpoint(work, model, optimizer, state)
    state = _loop(config, model, optimizer, train, len(pairs.train), val, pad, device, work,
                  state, progress, log)  # fmt: skip
    set_lora(model, work / BEST_FILE)
    if state["best_step"] == 0:  # the folder is then the base model, said before it is used
        log(f"tune: no step beat the base model's validation AUC ({state['best_auc']:.3f}); "
            "the folder holds the base model's weights (more training pairs or users, a lower "
            "--lr, or a larger --model may help)")  # fmt: skip
    card = _card(config, data, pairs, train, val, state, device, time.perf_counter() - t0,
                 len(skipped))  # fmt: skip
    card["data"]["suspicious_text"] = flagged
    _merge_and_save(model, config, out, card, _users_record(pairs))
    del model, optimizer, params
    release_freed_memory()  # the training's peak is not kept for what runs next
    return TuneResult(out, card)


def suspicious_training(data: Any, pairs: TunePairs, read: Sequence[int]) -> dict[str, Any]:
    """Items of the training pairs the steps read whose raw text is shaped like an
    instruction or an answer (``data.suspicious_items``): ``suspicious_summary`` plus how many
    of those pairs show one (as candidate or in the history). Issue 110: a title carrying a
    trigger is how a catalogue backdoors a tuned recommender LLM (BadRec, 2025)."""
    shown: list[set[str]] = []
    for i in read:
        req = pairs.train[i].request
        shown.append({req.candidate_id, *(h.item_id for h in req.history)})
    ids = set().union(*shown) if shown else set()
    rows = [r for r in data.items.to_dict("records") if str(r.get("item_id")) in ids]
    flagged = suspicious_items(rows)
    return {**suspicious_summary(flagged, examples=20),
            "training_pairs": sum(bool(s & flagged.keys()) for s in shown)}  # fmt: skip


def tuning_pairs(config: TuneConfig, data: Any, exclude_users: Sequence[str] = ()) -> TunePairs:
    """The pairs ``config`` builds from ``data`` (``build_pairs`` with its settings): the same
    pairs whenever called with the same log, settings and excluded users (seeded)."""
    return build_pairs(
        data, future_fraction=config.future_fraction,
        positives_per_user=config.positives_per_user,
        negatives_per_positive=config.negatives_per_positive, min_rating=config.min_rating,
        validation_users=config.validation_users, max_users=config.max_users,
        exclude_users=exclude_users, before=config.before, min_history=config.min_history,
        evidence_items=config.evidence_items, seed=config.seed,
        negatives=config.negatives, listed_items=config.listed_items,
    )  # fmt: skip


def prompting_judge(config: TuneConfig) -> Any:
    """The judge whose prompts the tuning trains on (no-behavior, the tuning's history and
    evidence caps). Only its tokenizer and templates are used: the model it loads is not
    trained and is not kept in ``load_llm``'s cache (freed before training loads one)."""
    settings = JudgeConfig(
        model=config.model,
        mode="no-behavior",
        max_history=config.max_history,
        max_evidence=config.max_evidence,
    )
    return Judge(settings, llm=load_llm(LLMConfig(model=config.model, device="cpu"),
                                        reuse=False))  # fmt: skip


def _prepared(
    config: TuneConfig, data: Any, exclude_users: Sequence[str], log: Callable[[str], None]
) -> tuple[Any, dict[int, Example], list[Example], int, list[str]]:
    """The pairs of ``data`` (``build_pairs``) and, as the judge prompts them, the training
    examples the planned steps read (by index) and the validation examples; the pad token
    id; the pairs skipped (why, per pair).

    Raises:
        ValueError: too few usable pairs to tune and validate.
    """
    pairs = tuning_pairs(config, data, exclude_users)
    assert pairs.rule is not None
    judge = prompting_judge(config)
    skipped: list[str] = []
    # only the training pairs the steps read are rendered and tokenised
    train = encode_examples(judge, pairs.train, pairs.rule, skipped,
                      used_examples(len(pairs.train), config) if pairs.train else [])  # fmt: skip
    val = list(encode_examples(judge, pairs.validation, pairs.rule, skipped).values())
    for s in skipped[:3]:
        log(f"tune: pair skipped ({s})")
    if not train or len({e.label for e in val}) < 2:
        raise ValueError("too few usable pairs to tune and validate (need training pairs and "
                         "validation pairs of both labels); use a larger log")  # fmt: skip
    return pairs, train, val, pad_id(judge), skipped


def pad_id(judge: Any) -> int:
    """The token right-padded batches are filled with (the tokenizer's pad, else its EOS)."""
    tok = judge.llm.tokenizer
    return int(tok.pad_token_id or tok.eos_token_id or 0)


def _autocast(device: str, precision: str) -> Any:
    """bf16 autocast for ``precision == "bfloat16"`` (matmuls in bf16, weights and the
    adapter's updates fp32), else nothing."""
    import torch

    if precision != "bfloat16":
        return contextlib.nullcontext()
    return torch.autocast(device.split(":")[0], dtype=torch.bfloat16)


def _loop(config, model, optimizer, train, n, val, pad, device, work, state, progress,
          log) -> dict[str, Any]:  # fmt: skip
    """The optimiser steps from ``state['step']`` with evaluations, checkpoints and the early
    stop; returns the final state (also on disk). ``train`` maps the indices of the ``n``
    training pairs to their examples (a pair that could not be encoded is absent: its step
    trains on the rest of its batch)."""
    precision = config.resolved_precision(device)

    bar = tqdm(total=config.steps, initial=state["step"], desc="tune", unit="step",
               disable=not progress or state["stopped"] is not None)  # fmt: skip
    losses: list[float] = []
    t0 = time.perf_counter() - float(state.get("seconds") or 0.0)
    while state["step"] < config.steps and state["stopped"] is None:
        step = state["step"]
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step)
        batch = [train[i] for i in order_of(n, config, step) if i in train]
        t_step = time.perf_counter()
        if batch:
            with torch_seeded(config.seed * 1_000_003 + step):  # dropout: as on a resumed run
                loss = training_loss(model, batch, pad, device, config.decision_weight,
                                     precision)  # fmt: skip
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        state["train_seconds"] = state.get("train_seconds", 0.0) + time.perf_counter() - t_step
        state["step"] = step + 1
        bar.update(1)
        if state["step"] % config.eval_every == 0 or state["step"] == config.steps:
            t_eval = time.perf_counter()
            auc = validation_auc(model, val, pad, device)  # fp32 (decision_scores)
            state["eval_seconds"] = state.get("eval_seconds", 0.0) + time.perf_counter() - t_eval
            state["history"].append(
                {
                    "step": state["step"],
                    "val_auc": auc,
                    "loss": float(np.mean(losses)) if losses else None,
                }
            )
            losses = []
            if auc is not None and (state["best_auc"] is None or auc > state["best_auc"]):
                state["best_auc"], state["best_step"], state["bad_evals"] = auc, state["step"], 0
                _write_tensors(work / BEST_FILE, _lora_state(model))
            else:
                state["bad_evals"] += 1
                if state["bad_evals"] >= config.patience:
                    state["stopped"] = (
                        f"early stop at step {state['step']}: no better "
                        f"validation AUC in {config.patience} evaluations"
                    )
                    log(f"tune: {state['stopped']}")
            state["seconds"] = time.perf_counter() - t0
            bar.set_postfix(val_auc=f"{auc:.3f}" if auc is not None else "n/a")
            save_checkpoint(work, model, optimizer, state)
    bar.close()
    return state


def _location_name(location: str | None) -> str | None:
    """Where the tuning data came from, as the card may show it: a dataset name as it is,
    a folder by its last part (``load_dataset`` records folders resolved)."""
    if not location:
        return None
    path = Path(location)
    return path.name if path.is_absolute() else location


def _model_name(model: str) -> str:
    """The base model as the card may show it: a preset or hub id as it is, a local folder
    by its last part (the card travels with the model: never this machine's path)."""
    if model in PRESETS:
        return model
    path = Path(model).expanduser()
    return path.name if path.exists() or path.is_absolute() else model


def _card(config, data, pairs, train, val, state, device, seconds, skipped) -> dict[str, Any]:
    """The card's fields (``llm._card``; the weight digests are added when saved)."""
    # the distinct pairs the steps that ran read (an early stop reads fewer than were encoded)
    read = [i for i in used_examples(len(pairs.train), config, state["step"]) if i in train]
    n_pos = sum(train[i].label for i in read)
    return {
        "format": TUNED_FORMAT,
        "version": TUNE_VERSION,
        "base_model": _model_name(config.model),
        "base_digest": base_digest(config.model),
        "data": {
            "name": data.name,
            # a registered name, or the folder's name: never this machine's path
            "location": _location_name(getattr(data, "location", None)),
            "interactions_read": pairs.interactions,
            "first_time": pairs.first_time,
            "last_time": pairs.last_time,
            "before": config.before,
            "users_read": len(pairs.users_last_time),
        },  # fmt: skip
        "pairs": {
            # the pairs the steps read of all the log gave
            "train": len(read),
            "train_available": len(pairs.train),
            "train_positive": n_pos,
            "train_negative": len(read) - n_pos,
            "validation": len(val),
            "validation_users": len(pairs.validation_users),
            "skipped": skipped,
            "evidence_rule": "item-item cosine over the training users' histories, "
            f"top {config.evidence_items} shown items with similarity > 0, else the most "
            "recent",
        },  # fmt: skip
        "steps": state["step"],
        "best_step": state["best_step"],
        "validation_auc": state["best_auc"],
        "validation_auc_before": state["history"][0]["val_auc"],
        "validation_score": "teacher-forced logsumexp(YES tokens) - logsumexp(NO tokens) at "
        "the decision token (the judge's read-out margin)",
        "history": state["history"],
        "stopped": state["stopped"],
        "seconds": round(seconds, 1),
        "train_seconds": round(float(state.get("train_seconds") or 0.0), 1),
        "eval_seconds": round(float(state.get("eval_seconds") or 0.0), 1),
        "device": device,
        "precision": config.resolved_precision(device),
        "config": {**config.model_dump(mode="json"), "model": _model_name(config.model)},
    }


#: files of the base folder that are not copied into the tuned one (weights are written anew)
_NOT_COPIED = ("config.json", "model.safetensors.index.json", "recjudge-cache.json")


def _merge_and_save(model: Any, config: TuneConfig, out: Path, card: dict[str, Any],
                    users: dict[str, Any]) -> None:  # fmt: skip
    """The adapter merged into the base weights, in the base's dtype, saved with the base's
    tokenizer files, the users record and the card (written last), atomically."""
    import torch

    base = base_folder(config.model)
    merged = model.merge_and_unload()
    dtype = _base_dtype(base)
    merged = merged.to(dtype=getattr(torch, dtype), device="cpu")
    with atomic_dir(out) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        for f in base.iterdir():
            if f.is_file() and f.suffix != ".safetensors" and f.name not in _NOT_COPIED \
                    and not (tmp / f.name).exists():  # fmt: skip
                shutil.copy2(f, tmp / f.name)
        atomic_write_json(tmp / USERS_FILE, users)
        weights = sorted(p.name for p in tmp.glob("*.safetensors"))
        # every file a loader may read (config, tokenizer, chat template, generation
        # config, weights, the users record): an edited chat template or config is refused
        files = sorted(p.name for p in tmp.iterdir() if p.is_file())
        card = {**card, "dtype": dtype,
                "weights_sha256": {w: sha256_file(tmp / w) for w in weights},
                "users_sha256": sha256_file(tmp / USERS_FILE),
                "files_sha256": {f: sha256_file(tmp / f) for f in files}}  # fmt: skip
        (tmp / TUNED_CARD).write_text(json.dumps(card, indent=1, sort_keys=True),
                                      encoding="utf-8")  # fmt: skip
        sign_card(tmp)  # with $RECJUDGE_SIGNING_KEY set: recjudge-tuned.sig, else nothing


def _base_dtype(folder: Path) -> str:
    """The dtype the base folder's weights are stored in (its config), bf16 when unsaid."""
    try:
        cfg = json_loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "bfloat16"
    dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16")
    return dtype if dtype in ("bfloat16", "float16", "float32") else "bfloat16"
