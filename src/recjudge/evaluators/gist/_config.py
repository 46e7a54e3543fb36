"""GISTBench's settings (its own module: the pipeline, prompts and report all read it, and
none of them is imported by it)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from recjudge.evaluators.gist._metrics import Predicate


# -- configuration ------------------------------------------------------------------------
class GistConfig(BaseModel):
    """GISTBench settings. Defaults are the paper's protocol; every other value is a deviation
    that ``deviations()`` names for the report header.

    Attributes:
        models: models under test (presets, paths or Hugging Face ids).
        judge: the verifying judge model (separate from the models under test).
        users: users evaluated (sampled by sha256 of the id).
        min_history: users with fewer interactions are not sampled.
        max_history: most recent engagements considered (``None``, the paper: the whole
            history, in chunks of ``chunk_size``).
        chunk_size: engagements per extraction prompt (the paper: 100).
        max_interests: a grammar cap on interests per chunk (``None``, the paper: no cap;
            the answer is bounded by ``extraction_tokens``).
        max_ids: a grammar cap on cited objects per interest (``None``: no cap).
        extraction_tokens: token budget of one extraction answer; a cut answer keeps its
            complete entries (counted as incomplete).
        words: interest length in words (min, max).
        interest_example: the one example interest the extraction prompt gives (ours: the
            paper's prompt could not be read here). Interests that repeat it are counted
            (``echoes_example``). Any text; it is only put in the prompt.
        max_citations: the prompt asks to cite an object in at most this many interests
            (the paper's rule, instructed only).
        enforce_citations: drop citations beyond ``max_citations`` (counted either way).
        predicate: the verification rule.
        evidence_for_specificity: n = min(|O_j|, this) evidence objects, sampled from the
            interest's cited set O_j (the paper: 5).
        options: evidence + distractors shown per specificity question (the paper: 50).
        pool_size: global distractor pool size (the paper: 1000).
        taxonomy: ``full`` (the paper: the judge picks among all 325 categories),
            ``shortlist`` (among ``shortlist`` categories preselected by embedding and
            trigram similarity; its agreement with ``full`` is measured on
            ``agreement_sample`` interests and reported) or ``off`` (each interest is its
            own category).
        shortlist: categories offered per interest with ``taxonomy="shortlist"``.
        agreement_sample: interests asked both ways to measure the shortlist's agreement.
        batch_size: questions per engine call. On the fast engine a batch's other questions
            can change an answer in its last bits (bf16 arithmetic depends on the batch
            shape), so a question asked again in another batch (a resumed run, a store
            imported on a new machine) can come out different: one of 29 extraction answers
            did on Book-Crossing.
        deterministic: the batch-invariant engine for every decoded answer (extraction,
            evidence filter, specificity; the whole-name taxonomy choice is per interest
            anyway): an answer is bit-identical whatever else shares its batch, for the same
            ``batch_size`` (its fixed row count), so re-asked answers repeat exactly on the
            same kind of machine. Slower (1.58x on the throughput bench's full answers);
            transformers backends only. Not a deviation: it changes how, not what, is asked.
        seed: sampling seed.
        bootstrap: user resamples for the intervals over users (``gist_intervals``).
        share_judge_answers: the judge's answers (evidence filter, taxonomy, distractor
            verdicts, specificity) are also kept in one store under
            ``$RECJUDGE_CACHE/gist`` and reused by every later run and every system, whatever
            its ``--out``: they depend on the dataset, the interest and the judge only, and
            their keys are content hashes of exactly that. ``False``: only the run's store.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: tuple[str, ...] = ("smollm2-135m",)
    judge: str = "qwen2.5-coder-0.5b"
    users: int = Field(30, ge=1)
    min_history: int = Field(20, ge=1)
    max_history: int | None = Field(None, ge=1)
    chunk_size: int = Field(100, ge=5)
    max_interests: int | None = Field(None, ge=1)
    max_ids: int | None = Field(None, ge=1)
    extraction_tokens: int = Field(1024, ge=16)
    words: tuple[int, int] = (2, 5)
    interest_example: str = Field(
        "1990s crime thrillers",
        min_length=1,
        max_length=200,
        json_schema_extra={"cli": ["--example"]},
    )
    max_citations: int = Field(2, ge=1)
    enforce_citations: bool = False
    predicate: Predicate = Predicate()
    evidence_for_specificity: int = Field(5, ge=1)
    options: int = Field(50, ge=2)
    pool_size: int = Field(1000, ge=10)
    taxonomy: Literal["full", "shortlist", "off"] = "full"
    shortlist: int = Field(24, ge=2)
    agreement_sample: int = Field(50, ge=0)
    batch_size: int = Field(8, ge=1)
    deterministic: bool = False
    seed: int = 0
    bootstrap: int = Field(1000, ge=0)
    share_judge_answers: bool = True

    # Every field is classified (tests/evaluators/test_store_keys.py fails on one that is not).
    # KEYED: in a stored question's key, as a part or setting (models, judge, budget, engine)
    # or through the messages and schema hashed into it (history, chunks, caps, example,
    # the citation limit and the verification rule the extraction prompt states, options
    # and distractors, the seed that draws them). UNKEYED: which questions are asked (users,
    # the agreement sample), what is computed from the answers (the citation rule's
    # enforcement, bootstrap), or speed (batch_size: documented above; share_judge_answers:
    # where an answer under the same key is looked up first).
    KEYED: ClassVar[frozenset[str]] = frozenset(
        {"models", "judge", "max_history", "chunk_size", "max_interests", "max_ids",
         "extraction_tokens", "words", "interest_example", "max_citations", "predicate",
         "evidence_for_specificity", "options", "pool_size", "taxonomy", "shortlist",
         "deterministic", "seed"}
    )  # fmt: skip
    UNKEYED: ClassVar[frozenset[str]] = frozenset(
        {"users", "min_history", "enforce_citations", "agreement_sample", "batch_size",
         "bootstrap", "share_judge_answers"}
    )  # fmt: skip

    def deviations(self) -> list[str]:
        """How this configuration departs from the paper's protocol."""
        out = []
        if self.max_history is not None:
            out.append(f"only the latest {self.max_history} engagements (the paper: all)")
        if self.chunk_size != 100:
            out.append(f"chunks of {self.chunk_size} engagements (the paper: 100)")
        if self.max_interests is not None or self.max_ids is not None:
            out.append(
                f"grammar caps: {self.max_interests or 'any'} interests per chunk, "
                f"{self.max_ids or 'any'} ids per interest (the paper: none)"
            )
        if self.enforce_citations:
            out.append(
                f"citations beyond {self.max_citations} per object are dropped (the paper "
                "only instructs the rule)"
            )
        if self.evidence_for_specificity != 5 or self.options != 50 or self.pool_size != 1000:
            out.append(
                f"specificity with n <= {self.evidence_for_specificity} of {self.options} "
                f"options from a pool of {self.pool_size} (the paper: 5 of 50 from 1000)"
            )
        if self.taxonomy == "shortlist":
            out.append(
                f"taxonomy choice among a {self.shortlist}-category shortlist (the paper: all "
                "325; agreement with the full choice is reported)"
            )
        elif self.taxonomy == "off":
            out.append("no taxonomy: each interest is its own category (the paper maps to 325)")
        return out


__all__ = ["GistConfig"]
