"""vLLM v1's asyncio engine (vllm.v1.engine.async_llm.AsyncLLM) over the ssmserve engine.

One background thread runs the engine loop: it adds the requests generate() queued, runs an engine step (the C++
engine, with the GIL released, so the event loop keeps running) and hands each step's outputs to the event loops
of the waiting generate() calls. Every request of every caller shares that one continuous-batching engine.
"""
import asyncio
import dataclasses
import itertools
import os
import threading
import weakref
from typing import Any, AsyncGenerator, Dict, Iterable, List, Optional, Union

from . import _ssmserve
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import RequestOutputKind

_ABORTED = object()  # stream item: the request was aborted (AsyncLLM.abort)


@dataclasses.dataclass
class EngineArgs:
    """vLLM's EngineArgs: the arguments of LLM(...) as one object (see ssmserve.LLM for each one's meaning;
    LLM(**dataclasses.asdict(args)) takes them all). Unknown field names are a TypeError (dataclass); bad values are
    found when the engine is made (AsyncLLM.from_engine_args), as LLM(...) finds them."""
    model: str
    tokenizer: Optional[str] = None
    dtype: str = "auto"
    seed: Optional[int] = 0  # vLLM's ModelConfig.seed; None: unseeded requests differ every run
    max_model_len: Optional[int] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enable_prefix_caching: Optional[bool] = None
    speculative_config: Optional[dict] = None
    device: str = "auto"
    load_format: str = "auto"
    # ssmserve's own (the CLI's flags); None = the engine's default.
    threads: Optional[int] = None
    num_state_blocks: Optional[int] = None
    mamba_cache_dtype: Optional[str] = None
    mamba_ssm_cache_dtype: Optional[str] = None
    num_scheduler_steps: Optional[int] = None
    mamba_cache_mode: Optional[str] = None
    quantization: Optional[str] = None  # vLLM's: the checkpoint's FP8 / GPTQ / AWQ format, checked against config.json
    mamba_block_size: Optional[int] = None
    swap_space: Optional[float] = None
    log_level: Optional[str] = None  # the process's engine log level (see ssmserve.LLM)
    # vLLM's default sampling params (see ssmserve.LLM); None = "auto" / no overrides.
    generation_config: Optional[str] = None
    override_generation_config: Optional[dict] = None
    max_logprobs: int = 20  # the engine's cap (see ssmserve.LLM)
    enforce_eager: bool = False  # vLLM's: no CUDA graphs
    # vLLM's arguments that have no effect here, at their vLLM defaults (ssmserve.LLM lists the values each takes).
    trust_remote_code: bool = False
    disable_log_stats: bool = False
    tokenizer_mode: str = "auto"
    revision: Optional[str] = None
    tokenizer_revision: Optional[str] = None
    code_revision: Optional[str] = None
    skip_tokenizer_init: bool = False
    task: str = "auto"
    runner: str = "auto"
    enable_chunked_prefill: Optional[bool] = None
    kv_cache_dtype: str = "auto"
    block_size: Optional[int] = None
    cpu_offload_gb: float = 0
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: Optional[str] = None
    download_dir: Optional[str] = None
    hf_overrides: Optional[dict] = None
    compilation_config: Optional[Union[int, dict]] = None
    max_seq_len_to_capture: int = 8192
    disable_custom_all_reduce: bool = False
    model_impl: str = "auto"
    disable_async_output_proc: bool = False
    enable_sleep_mode: bool = False
    async_scheduling: Optional[bool] = None
    scheduling_policy: str = "fcfs"
    disable_log_requests: bool = False
    enable_log_requests: bool = False

    def _engine_and_seeder(self):
        """The engine these arguments make and its _Seeder (engine seed, max_logprobs). TypeError / ValueError as
        LLM(...)."""
        from . import _check_no_effect_args, _check_seed, _make_engine, _NO_EFFECT_ARGS, _Seeder, _SSMSERVE_ENGINE_ARGS

        seed = _check_seed(self.seed)
        max_logprobs = _check_no_effect_args({k: getattr(self, k) for k in _NO_EFFECT_ARGS})
        own = {k: getattr(self, k) for k in _SSMSERVE_ENGINE_ARGS if hasattr(self, k) and getattr(self, k) is not None}
        engine = _make_engine(self.model, self.tokenizer, self.dtype, self.max_model_len, self.max_num_seqs,
                              self.max_num_batched_tokens, self.gpu_memory_utilization, self.tensor_parallel_size,
                              self.enable_prefix_caching, self.speculative_config, self.device, self.load_format, own)
        return engine, _Seeder(seed, max_logprobs)


@dataclasses.dataclass
class AsyncEngineArgs(EngineArgs):
    """vLLM's AsyncEngineArgs (AsyncLLM.from_engine_args): the same fields as EngineArgs."""


class _Stream:
    """One generate() call's queue, on its event loop, and the caller's request id."""
    __slots__ = ("loop", "queue", "user_id")

    def __init__(self, loop: asyncio.AbstractEventLoop, user_id: str):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.user_id = user_id


class _Core:
    """The engine, its background loop thread and the request streams (what the thread holds: AsyncLLM itself can
    be garbage-collected, which shuts the core down)."""

    def __init__(self, engine):
        self.engine = engine
        self.pid = os.getpid()  # the process whose threads run the engine (a fork()ed child has none of them)
        self.cv = threading.Condition()
        self.inbox: List[tuple] = []              # ("add", id, prompt, params) / ("abort", id), in call order
        # The engine sees a unique id per generate() call ("<request_id>#<n>", and "<request_id>#<n>.<c>" for choice c
        # of n > 1: one engine request per choice), so a caller may reuse a request_id as soon as its previous stream
        # ended, without the old request's late outputs or abort reaching the new stream.
        self.streams: Dict[str, _Stream] = {}     # running engine id -> its generate() call's stream (under cv)
        self.users: Dict[str, List[str]] = {}     # running caller request_id -> its running engine ids (under cv)
        self.counter = itertools.count()
        self.closed = False
        self.dead: Optional[BaseException] = None  # why the loop stopped (an engine failure)
        self.thread = threading.Thread(target=self._run, name="ssmserve-async-engine", daemon=True)
        self.thread.start()

    def submit(self, *ops: tuple) -> None:
        """Queues ops for the engine loop, all at once (the choices of n > 1 join the same engine step)."""
        with self.cv:
            if self.closed:
                raise RuntimeError("the AsyncLLM is shut down")
            self.inbox.extend(ops)
            self.cv.notify()

    def forget(self, user_id: str, engine_id: str) -> None:
        """Drops a finished or abandoned engine id from its caller's running ids (cv held)."""
        ids = self.users.get(user_id)
        if ids is not None and engine_id in ids:
            ids.remove(engine_id)
            if not ids:
                del self.users[user_id]

    def _deliver(self, items: List[tuple]) -> None:
        """Hands (request id, item) pairs to their streams' event loops; a finished request's stream is dropped."""
        by_loop: Dict[asyncio.AbstractEventLoop, List[tuple]] = {}
        with self.cv:
            for rid, item in items:
                s = self.streams.get(rid)
                if s is None:
                    continue  # aborted or closed meanwhile
                if item is _ABORTED or isinstance(item, BaseException) or item.finished:
                    del self.streams[rid]
                    self.forget(s.user_id, rid)
                by_loop.setdefault(s.loop, []).append((s.queue, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # that event loop is closed: nobody waits for these
                self._abort_orphans(loop)

    def _abort_orphans(self, loop: asyncio.AbstractEventLoop) -> None:
        """Aborts every running request whose generate() call waits on `loop`, a closed event loop (closed without
        shutdown_asyncgens, so those generators never ran their cleanup): frees their engine state and their request
        ids. Called by the engine loop thread (or after it stopped)."""
        with self.cv:
            orphans = [rid for rid, s in self.streams.items() if s.loop is loop]
            for rid in orphans:
                self.forget(self.streams.pop(rid).user_id, rid)
        for rid in orphans:
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 (a failed engine: nothing left to free)
                pass

    def _run(self) -> None:
        engine = self.engine
        busy = False
        try:
            while True:
                with self.cv:
                    while not self.inbox and not busy and not self.closed:
                        self.cv.wait()
                    if self.closed:
                        return
                    ops, self.inbox = self.inbox, []
                items = []
                for op in ops:
                    if op[0] == "add":
                        try:
                            engine.add_async(op[2], op[3], op[1])
                        except Exception as e:  # noqa: BLE001 (a bad request: its caller gets the error)
                            items.append((op[1], e))
                    else:
                        engine.abort(op[1])
                        items.append((op[1], _ABORTED))
                outs = engine.step_async()
                busy = engine.has_unfinished()
                items.extend((o.request_id, o) for o in outs)
                if items:
                    self._deliver(items)
        except BaseException as e:  # noqa: BLE001 (the engine failed: every caller gets the error)
            err = RuntimeError(f"the AsyncLLM engine loop stopped: {e}")
            err.__cause__ = e
            self.dead = err
            with self.cv:
                rids = list(self.streams)
            self._deliver([(rid, err) for rid in rids])

    def shutdown(self) -> None:
        if os.getpid() != self.pid:  # a fork()ed child (its finalizer at exit): the engine is the parent's
            self.closed = True
            return
        with self.cv:
            self.closed = True
            rids = list(self.streams)
            self.cv.notify()
        if self.thread is not threading.current_thread():
            self.thread.join()
        self._deliver([(rid, RuntimeError("the AsyncLLM was shut down")) for rid in rids])
        for rid in rids:
            self.engine.abort(rid)


def _put_all(batch: List[tuple]) -> None:
    for queue, item in batch:
        queue.put_nowait(item)


def _aborted_output(request_id: str, prompt, last: Optional[RequestOutput], n: int = 1,
                    want_logprobs: bool = False) -> RequestOutput:
    """The final output of an aborted request: its last output (or an empty one with n choices) with finish_reason
    "abort" on every choice that had not finished."""
    if last is None:
        text = prompt if isinstance(prompt, str) else (prompt.get("prompt") if isinstance(prompt, dict) else None)
        ids = list(prompt) if isinstance(prompt, (list, tuple)) else (
            list(prompt.get("prompt_token_ids") or []) if isinstance(prompt, dict) else [])
        outs = [CompletionOutput(c, "", [], [] if want_logprobs else None, "abort",
                                 cumulative_logprob=0.0 if want_logprobs else None) for c in range(n)]
        return RequestOutput(request_id, text, ids, outs, True)
    outs = [dataclasses.replace(c, finish_reason=c.finish_reason or "abort") for c in last.outputs]
    return dataclasses.replace(last, outputs=outs, finished=True, delta_text="")


class _DeltaState:
    """What a DELTA stream (SamplingParams.output_kind = RequestOutputKind.DELTA) has handed its caller: per choice,
    the tokens given so far and the text that became final since (the engine's delta_text, joined)."""

    def __init__(self, n: int):
        self.sent_tokens = [0] * n
        self.pending_text = [""] * n
        self.first = True

    def take(self, out: RequestOutput) -> RequestOutput:
        """`out` (cumulative) as vLLM's DELTA output: each choice's text, token_ids and logprobs only what is new since
        the previous output taken; prompt_logprobs only in the first. Marks it all as given."""
        outs = []
        for c, comp in enumerate(out.outputs):
            k = self.sent_tokens[c]
            outs.append(dataclasses.replace(comp, text=self.pending_text[c], token_ids=comp.token_ids[k:],
                                            logprobs=None if comp.logprobs is None else comp.logprobs[k:]))
            self.sent_tokens[c] = len(comp.token_ids)
            self.pending_text[c] = ""
        delta = dataclasses.replace(out, outputs=outs, prompt_logprobs=out.prompt_logprobs if self.first else None)
        self.first = False
        return delta


def _merge_choices(latest: List[Optional[RequestOutput]], want_logprobs: bool) -> RequestOutput:
    """One RequestOutput of the n choices' newest outputs (each its own engine request): outputs[c] is choice c
    (empty until its first output), finished once every choice finished. delta_text is "" (each choice's text is in
    outputs[c].text). Metrics: choice 0's arrival, the latest token / finish times over the choices."""
    base = next(o for o in latest if o is not None)
    outs = []
    for c, o in enumerate(latest):
        if o is None:
            outs.append(CompletionOutput(c, "", [], [] if want_logprobs else None, None,
                                         cumulative_logprob=0.0 if want_logprobs else None))
        else:
            outs.append(dataclasses.replace(o.outputs[0], index=c))
    finished = all(o is not None and o.finished for o in latest)
    metrics = base.metrics
    if metrics is not None:
        def latest_of(name):
            vals = [getattr(o.metrics, name) for o in latest if o is not None and o.metrics is not None]
            vals = [v for v in vals if v is not None]
            return max(vals) if vals else None

        metrics = dataclasses.replace(metrics, last_token_time=latest_of("last_token_time"),
                                      finished_time=latest_of("finished_time") if finished else None)
    return dataclasses.replace(base, outputs=outs, finished=finished, delta_text="", metrics=metrics)


class AsyncLLM:
    """vLLM v1's AsyncLLM: an asyncio engine for applications that stream.

        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model="models/tiny-mamba"))
        async for out in engine.generate("Hello", SamplingParams(max_tokens=32), request_id="r1"):
            print(out.outputs[0].text)  # cumulative text; out.delta_text is what is new
        engine.shutdown()

    Many concurrent generate() calls (from any number of tasks or event loops) share one continuous-batching
    engine, run by a background thread with the GIL released while it computes. Thread-safe. Also a context manager
    (shutdown on exit)."""

    def __init__(self, model: str, **engine_args: Any):
        """AsyncLLM(model, **kwargs): the keyword arguments of ssmserve.LLM (EngineArgs' fields)."""
        engine, self._with_seed = EngineArgs(model, **engine_args)._engine_and_seeder()
        self._core = _Core(engine)
        weakref.finalize(self, _Core.shutdown, self._core)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, **_ignored: Any) -> "AsyncLLM":
        """vLLM's constructor: AsyncLLM.from_engine_args(AsyncEngineArgs(model=..., ...)). Keyword arguments vLLM
        takes here (usage_context, start_engine_loop, ...) are accepted and ignored."""
        if not isinstance(engine_args, EngineArgs):
            raise TypeError(f"from_engine_args takes an AsyncEngineArgs, got {type(engine_args).__name__}")
        self = cls.__new__(cls)
        engine, self._with_seed = engine_args._engine_and_seeder()
        self._core = _Core(engine)
        weakref.finalize(self, _Core.shutdown, self._core)
        return self

    async def generate(self, prompt, sampling_params=None, request_id: Optional[str] = None, *,
                       lora_request: Any = None, trace_headers: Any = None,
                       priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """Streams one request's outputs: a cumulative RequestOutput after every engine step that produced text
        for it (when the caller falls behind, outputs are merged: the newest one, delta_text joined), the last one
        with finished=True. prompt: a str, a list of int token ids, or a {"prompt"} / {"prompt_token_ids"} dict.
        request_id: unique among running requests (a ValueError otherwise). Leaving the `async for` early (break,
        task cancelled) aborts the request. An aborted request (abort()) ends with finish_reason "abort". n > 1 (as
        vLLM and LLM.generate): each choice is its own engine request (choice c seeded seed + c when seeded), every
        output holds all n choices (outputs[c]; not yet started ones empty) with delta_text "", finished once all
        are; abort() and leaving early abort every choice. sampling_params None: the model's defaults (as
        LLM.get_default_sampling_params). SamplingParams.output_kind (vLLM's RequestOutputKind): CUMULATIVE (the
        default) as above; DELTA: each output's choices carry only what is new since the previous output (text,
        token_ids, logprobs; prompt_logprobs in the first output only; cumulative_logprob stays the running sum);
        FINAL_ONLY: only the finished output. Bad sampling params or prompts raise ValueError / TypeError from the first
        iteration. lora_request must be None (no LoRA adapters); trace_headers and priority are accepted and ignored (vLLM's signature)."""
        from . import SamplingParams, _check_process

        _check_process(self._core.pid, "AsyncLLM")
        if lora_request is not None:
            raise NotImplementedError("lora_request: LoRA adapters are not supported by ssmserve")
        if request_id is None or not isinstance(request_id, str):
            raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
        if sampling_params is None:  # the model's defaults, as LLM.generate (LLM.get_default_sampling_params)
            sampling_params = SamplingParams(**self._core.engine.default_sampling_params())
        if not isinstance(sampling_params, _ssmserve.SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(sampling_params).__name__}")
        if not isinstance(prompt, (str, dict, list, tuple)):
            raise TypeError("a prompt must be a str, a list of int token ids, or a dict with \"prompt\" or "
                            f"\"prompt_token_ids\"; got {type(prompt).__name__}")
        core = self._core
        if core.dead is not None:
            raise core.dead
        params = self._with_seed(sampling_params)
        n = params.n
        if not isinstance(n, int) or not 1 <= n <= 1024:
            raise ValueError(f"SamplingParams.n must be in [1, 1024], got {n}")
        if n > 1:  # one engine request per choice, choice c seeded seed + c (as LLM.generate)
            choices = []
            for c in range(n):
                q = params.clone()
                q.n = 1
                if q.seed is not None:
                    q.seed = (q.seed + c) % 2**64
                choices.append(q)
        else:
            choices = [params]
        stream = _Stream(asyncio.get_running_loop(), request_id)
        with core.cv:
            if request_id in core.users:
                raise ValueError(f"request_id '{request_id}' is already running")
            base = f"{request_id}#{next(core.counter)}"
            engine_ids = [base] if n == 1 else [f"{base}.{c}" for c in range(n)]
            core.users[request_id] = list(engine_ids)
            for e in engine_ids:
                core.streams[e] = stream
        engine_prompt = list(prompt) if isinstance(prompt, tuple) else prompt
        try:
            core.submit(*(("add", e, engine_prompt, q) for e, q in zip(engine_ids, choices)))
        except BaseException:
            with core.cv:
                for e in engine_ids:
                    core.streams.pop(e, None)
                core.users.pop(request_id, None)
            raise
        from . import _is_text_prompt

        text_prompt = _is_text_prompt(prompt)
        choice_of = {e: c for c, e in enumerate(engine_ids)}
        latest: List[Optional[RequestOutput]] = [None] * n  # each choice's newest output
        last: Optional[RequestOutput] = None
        kind = params.output_kind
        delta_kind = kind == RequestOutputKind.DELTA
        final_only = kind == RequestOutputKind.FINAL_ONLY
        sent = _DeltaState(n)  # DELTA: what the caller has been given of each choice
        try:
            while last is None or not last.finished:
                items = [await stream.queue.get()]
                while not stream.queue.empty():  # outputs the caller fell behind on: merged into one (cumulative)
                    items.append(stream.queue.get_nowait())
                delta, changed, aborted = "", False, False
                for item in items:
                    if isinstance(item, BaseException):
                        raise item
                    if item is _ABORTED:  # abort() aborts every choice
                        aborted = True
                        break
                    c = choice_of.get(item.request_id)
                    if c is None:
                        continue
                    delta += item.delta_text
                    sent.pending_text[c] += item.delta_text
                    latest[c] = item
                    changed = True
                if changed:
                    if n == 1:
                        out = latest[0]
                        out.delta_text = delta
                    else:
                        out = _merge_choices(latest, params.logprobs is not None)
                    out.request_id = request_id  # the caller's id, not the engine's
                    if not text_prompt:
                        out.prompt = None  # token ids alone (vLLM)
                    last = out
                if aborted:
                    out = _aborted_output(request_id, prompt, last, n, params.logprobs is not None)
                    yield sent.take(out) if delta_kind else out
                    return
                if changed and (not final_only or last.finished):
                    yield sent.take(last) if delta_kind else last
        finally:
            # Choices still running (the caller left early, an error, an abort): free their engine state.
            with core.cv:
                left = [e for e in engine_ids if core.streams.get(e) is stream]
                for e in left:
                    del core.streams[e]
                    core.forget(request_id, e)
            if left:
                try:
                    core.submit(*(("abort", e) for e in left))
                except RuntimeError:
                    pass

    async def abort(self, request_id: Union[str, Iterable[str]]) -> None:
        """Aborts requests (vLLM's AsyncLLM.abort): their engine state is freed and their generate() streams end
        with a final output whose finish_reason is "abort". Unknown or finished ids are ignored."""
        from . import _check_process

        _check_process(self._core.pid, "AsyncLLM")
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            if not isinstance(rid, str):
                raise TypeError(f"request_id must be a str, got {type(rid).__name__}")
        for rid in ids:
            with self._core.cv:
                engine_ids = list(self._core.users.get(rid, ()))
            if engine_ids:
                self._core.submit(*(("abort", e) for e in engine_ids))  # every choice of n > 1

    async def get_tokenizer(self):
        """The engine's tokenizer (vLLM's AsyncLLM.get_tokenizer)."""
        from . import Tokenizer, _check_process

        _check_process(self._core.pid, "AsyncLLM")
        return Tokenizer(self._core.engine, self._core.pid)

    async def reset_prefix_cache(self) -> bool:
        """vLLM's AsyncLLM.reset_prefix_cache: drops every cached prefix state (see ssmserve.LLM.reset_prefix_cache);
        False, dropping nothing, while any request runs. Blocks for up to one engine step."""
        from . import _check_process

        _check_process(self._core.pid, "AsyncLLM")
        return self._core.engine.reset_prefix_cache()

    def get_engine_stats(self) -> Dict[str, int]:
        """The engine's counters (see ssmserve.LLM.get_engine_stats). Blocks for up to one engine step."""
        from . import _check_process

        _check_process(self._core.pid, "AsyncLLM")
        return self._core.engine.stats()

    @property
    def is_running(self) -> bool:
        """True while the engine loop runs (not shut down, not failed)."""
        return self._core.thread.is_alive() and not self._core.closed

    @property
    def errored(self) -> bool:
        """True when the engine loop stopped on an error."""
        return self._core.dead is not None

    def shutdown(self) -> None:
        """Stops the engine loop; running requests end with a RuntimeError. Idempotent."""
        self._core.shutdown()

    def __reduce__(self):
        raise TypeError("ssmserve.AsyncLLM objects cannot be pickled or copied (they own a running engine)")

    def __enter__(self) -> "AsyncLLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
