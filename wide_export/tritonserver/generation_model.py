"""WIDE generation model for Triton's Python backend (copied as `<model>/1/model.py`).

Self-contained on purpose (numpy, onnxruntime, Triton's pb_utils; `tokenizers` for text): a
generated repository must run where wide_export is not installed. Its siblings contract.py (the
names, dtypes and shapes of its inputs and outputs), settings.py (generation.json), rows.py (a
request's rows, their checks, sampling), ortstep.py (the ONNX Runtime step), generation/decoding.py (the
generation loop: in-flight, and static as the same loop with no joins), textgen.py (tokenizer, stop
rules, streamed text) and metrics.py (Prometheus metrics through pb_utils.MetricFamily) are
copied beside it; this file parses requests, runs BLS steps and answers.

Interface (one prompt per row; the rows of an input_ids request share a length):
  inputs  exactly one of input_ids INT64 [-1] or text_input BYTES [1] (UTF-8, tokenized by the
          repository's tokenizer.json; add_special_tokens BOOL [1], default true, adds BOS as
          the tokenizer is configured);
          optional max_new_tokens INT32 [1] (a maximum; absent: the rest of the context),
          temperature FP32 [1], top_p FP32 [1], seed INT64 [1], stop_token_ids INT64 [-1],
          stop_words BYTES [-1] (stop strings), ignore_eos BOOL [1]
  outputs output_ids INT64 [-1] (the new tokens, a stop token included; rows that ended earlier
          are padded with pad_token_id), text_output BYTES [1] (their text, special tokens skipped,
          cut before a stop string), finish_reason BYTES [1] ("stop": an eos id, a stop token or a
          stop string; "length": max_new_tokens), num_input_tokens / num_output_tokens INT32 [1].
A row stops at any eos id of generation.json (from the export's generation_config.json),
at its stop token ids and stop strings, or after max_new_tokens (textgen.py).
Greedy when temperature is absent or 0, else temperature / top-p sampling
(seeded per request when `seed` is given).
Streaming (config.pbtxt `model_transaction_policy { decoupled: true }`, from
`wide-export triton --streaming`): one response per new token: output_ids [batch, 1],
text_output the text released by that token (a character split across tokens comes whole,
text that may start a stop string is held back until it cannot), finish_reason "" until the
row's last token, counts so far; then a final empty response flagged
TRITONSERVER_RESPONSE_COMPLETE_FINAL as soon as every row of the request is done.
A request whose client went away (cancelled) gets nothing more; a batch whose
clients all went away stops decoding.
In-flight batching (config parameter `batching: inflight`, the default of
`--streaming`): execute() hands requests to a scheduler thread (generation/decoding.py
beside this file) whose running batch new requests join at the next step and
finished ones leave; `batching: static` generates each execute()'s requests
together, start to end.

The settings come from `generation.json` beside this file (written by
`wide-export triton`). Flavours:
  onnxruntime: an ONNX Runtime session of model.onnx runs prefill and decode.
  tensorrt:    BLS requests to the tensorrt_plan model named in the settings (one
               model holding the engine's prefill and decode profiles; Triton's
               TensorRT backend runs each request on the profile its shapes fit).
               With "kv_cache_memory": "gpu" (the default) BLS outputs stay in GPU
               memory: present.* go back as the next past through DLPack, only the
               last position's logits come to host (needs PyTorch with CUDA).
Both drive the same graph contract: inputs input_ids, attention_mask,
position_ids, past_key_values.{i}.key|value; outputs logits,
present.{i}.key|value. Rows are left-padded; position_ids =
cumsum(attention_mask) - 1 clipped at 0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Callable, Optional

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (unit tests, direct use)
    pb_utils = None

def row_outputs(rows: list[Row], codec=None) -> list:
    """One textgen.RowOutput per row: its stop rule, finish reason and text."""
    textgen = load_sibling("textgen")
    return [textgen.RowOutput(r.prompt, r.max_new_tokens, r.stop_ids, r.stop_strings, codec) for r in rows]


def run_static(step: StepFn, settings: Settings, jobs: list, observe=None) -> None:
    """Run `jobs` (decoding.Job) to their ends together in the caller's thread: the in-flight batch's loop
    with no joins (decoding.Scheduler.drain). Their rows are prefilled together (left-padded) and each
    leaves the batch as soon as its output says it is done, so the padded width is always the longest
    remaining row's own length, which validate_row bounded. A failing step finishes the jobs with the
    error."""
    decoding = load_decoding()
    rows = sum(len(job.rows) for job in jobs)
    batch = decoding.Batch(step, settings, choose_tokens, max(1, rows))
    scheduler = decoding.Scheduler(batch, _log, observe=observe)
    for job in jobs:
        scheduler.submit(job)
    scheduler.drain()


def generate(step: StepFn, settings: Settings, rows: list[Row], outputs: Optional[list] = None,
             on_step: Optional[OnStep] = None) -> list:
    """Generate every row to its end (run_static, one job). `on_step(s, fresh)` sees, per row, the token
    it chose at step `s` or None for a row that ended earlier; returning False stops the generation.
    Returns each row's new tokens; `outputs` (default: length-only row_outputs) hold them too. A failing
    step raises RuntimeError("generation failed: ...")."""
    outputs = row_outputs(rows) if outputs is None else outputs
    steps: list[int] = []
    errors: list[str] = []

    def emit(fresh: list) -> bool:
        steps.append(len(steps))
        return on_step is None or bool(on_step(steps[-1], fresh))

    def finish(error: Optional[str]) -> None:
        if error is not None:
            errors.append(error)

    run_static(step, settings, [load_decoding().Job(rows=rows, emit=emit, finish=finish, outputs=outputs)])
    if errors:
        raise RuntimeError(errors[0])
    return [np.array(out.tokens, dtype=np.int64) for out in outputs]


def padded_tokens(outputs: list, pad: int) -> np.ndarray:
    """[rows, longest] output ids; rows that ended earlier are padded with `pad`."""
    longest = max(len(out.tokens) for out in outputs)
    block = np.full((len(outputs), longest), pad, dtype=np.int64)
    for b, out in enumerate(outputs):
        block[b, :len(out.tokens)] = out.tokens
    return block


def device_torch(why: str):
    """PyTorch with CUDA, which the device paths use through DLPack; RuntimeError (one line, with
    the way out) when this Python lacks it. The CPU paths never import it."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        found = "no PyTorch" if torch is None else f"PyTorch {torch.__version__} without CUDA"
        raise RuntimeError(f"{why} needs PyTorch with CUDA in the server's Python ({found} here): "
                           "pip install torch there")
    return torch


def bls_step(settings: Settings) -> StepFn:
    """A step function calling the tensorrt_plan model through BLS.

    Both phases go to one model (settings.engine_model) holding the engine's prefill and
    decode optimization profiles; Triton's TensorRT backend runs each request on the profile
    whose shape ranges hold it (tensorrt_backend src/instance_state.cc
    ModelInstanceState::GetMostOptimizedProfile): prefill requests carry a past of length 0,
    decode requests one of length >= 1, and the profiles do not overlap there.

    kv_cache_memory "gpu": the request asks for its outputs in GPU memory
    (`preferred_memory`, python_backend README "Business Logic Scripting"); the `present.*`
    tensors are returned as they are (pb_utils.Tensor in GPU memory, never `as_numpy()`,
    which refuses GPU tensors) and the next step sends them as `past_key_values.*`
    renamed through DLPack (`pb_utils.Tensor.from_dlpack(name, tensor)`: no copy). Only the
    last position's logits come to host memory, copied by PyTorch (`torch.from_dlpack`).
    kv_cache_memory "cpu": host outputs, everything as numpy (copies the KV cache through
    host memory every step; for servers without PyTorch).
    """
    names = [settings.io["logits"]] + [n for pair in settings.present_names() for n in pair]
    on_gpu = settings.kv_cache_memory == "gpu"
    torch = device_torch('kv_cache_memory "gpu" (generation.json)') if on_gpu else None
    memory = pb_utils.TRITONSERVER_MEMORY_GPU if on_gpu else pb_utils.TRITONSERVER_MEMORY_CPU

    def as_input(name: str, value):
        if isinstance(value, np.ndarray):
            return pb_utils.Tensor(name, np.ascontiguousarray(value))
        # A previous step's present (pb_utils.Tensor, GPU memory) or a cache tensor the in-flight
        # batch built on the device (torch): passed on by DLPack under its input name, not copied.
        return pb_utils.Tensor.from_dlpack(name, value)

    def last_logits(tensor) -> np.ndarray:
        if not on_gpu:
            return tensor.as_numpy()
        return torch.from_dlpack(tensor)[:, -1:, :].cpu().numpy()  # [B, 1, V]: 4·B·V bytes to host

    def step(feeds: dict, phase: str) -> tuple:
        model = settings.model_for(phase)
        request = pb_utils.InferenceRequest(
            model_name=model,
            inputs=[as_input(name, value) for name, value in feeds.items()],
            requested_output_names=names,
            preferred_memory=pb_utils.PreferredMemory(memory, 0),
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        outs = [pb_utils.get_output_tensor_by_name(response, name) for name in names]
        if not on_gpu:
            outs = [outs[0]] + [t.as_numpy() for t in outs[1:]]
        presents = [(outs[1 + 2 * i], outs[2 + 2 * i]) for i in range(settings.num_layers)]
        return last_logits(outs[0]), presents

    return step


def check_device_cache_ops(settings: Settings, step: StepFn, decoding) -> None:
    """The batch loop (in-flight and static) rebuilds a KV cache on a device there when a row joins or
    leaves (PyTorch over DLPack): fail at model load, with the way out, rather than at the first leave."""
    if settings.flavour == "onnxruntime":
        if getattr(step, "device", "cpu") == "cpu":
            return
        import onnxruntime as ort

        if not callable(getattr(ort.OrtValue, "__dlpack__", None)):
            raise RuntimeError(f"generation on {step.device} needs OrtValue.__dlpack__ (rows join and leave the batch "
                               f"on the device), which onnxruntime {ort.__version__} lacks: upgrade onnxruntime "
                               "(1.32 has it) in the server's Python")
    elif settings.kv_cache_memory != "gpu":
        return
    decoding.TorchCacheOps()  # RuntimeError when PyTorch is missing


def load_sibling(name: str):
    """A module of this folder (contract, settings, rows, ortstep, decoding, textgen, metrics: the package's
    own modules when this is the package's module, else the files beside it, loaded once by path)."""
    if __package__:  # a package: Triton's model folder ("1"), or ours, whose siblings are the generation layer's
        home = __package__
        if __package__.endswith("tritonserver") and name not in ("contract", "metrics"):
            home = __package__.rsplit(".", 1)[0] + ".generation"
        return importlib.import_module(f"{home}.{name}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    key = f"wide_{name}_{abs(hash(path))}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[key]


C = load_sibling("contract")  # the I/O contract: every tensor name this model reads and writes
_settings, _rows, _ortstep = load_sibling("settings"), load_sibling("rows"), load_sibling("ortstep")
SETTINGS_FILE, Settings, StepFn = _settings.SETTINGS_FILE, _settings.Settings, _settings.StepFn
RequestError, Row, validate_row, choose_tokens = _rows.RequestError, _rows.Row, _rows.validate_row, _rows.choose_tokens
ort_step, _bind_torch_input = _ortstep.ort_step, _ortstep._bind_torch_input
# Called after every decode step with (step index, that step's token per row [rows]);
# returning False stops the generation (nobody is listening any more).
OnStep = Callable[[int, np.ndarray], bool]


def load_decoding():
    """The generation loop (decoding.py beside this file)."""
    return load_sibling("decoding")


def _per_row(request, name: str, batch: int, default):
    """Per-row first values of an optional [b, 1] input (one row broadcasts), or `default`."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return [default] * batch
    array = tensor.as_numpy()
    values = [v.item() if hasattr(v, "item") else v for v in array.reshape(array.shape[0], -1)[:, 0]]
    if len(values) == batch:
        return values
    if len(values) == 1:
        return values * batch
    raise RequestError(f"{name} has batch {len(values)}, the prompts have {batch}")


def _per_row_lists(request, name: str, batch: int) -> list[list]:
    """Per-row lists of an optional [b, n] input (one row broadcasts); empty lists when absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return [[] for _ in range(batch)]
    array = tensor.as_numpy()
    array = array.reshape(array.shape[0], -1) if array.ndim else array.reshape(1, 1)
    if array.shape[0] not in (1, batch):
        raise RequestError(f"{name} has batch {array.shape[0]}, the prompts have {batch}")
    rows = [list(array[min(b, array.shape[0] - 1)]) for b in range(batch)]
    return rows


def _text(value, name: str) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"{name} is not valid UTF-8") from None
    return str(value)


def _prompts(request, codec) -> list[np.ndarray]:
    """The request's prompts as token ids: from input_ids, or text_input through the tokenizer."""
    ids = pb_utils.get_input_tensor_by_name(request, C.INPUT_IDS)
    text = pb_utils.get_input_tensor_by_name(request, C.TEXT_INPUT)
    if (ids is None) == (text is None):
        raise RequestError("send exactly one of input_ids (token ids) or text_input (text)")
    if ids is not None:
        ids = ids.as_numpy()
        if ids.ndim != 2:
            raise RequestError(f"input_ids must be [batch, tokens], got shape {list(ids.shape)}")
        return [ids[b].astype(np.int64) for b in range(ids.shape[0])]
    if codec is None:
        raise RequestError("this repository has no tokenizer (tokenizer.json): send input_ids, or regenerate "
                           "the repository from an export of a model folder with its tokenizer files")
    texts = text.as_numpy().reshape(-1)
    specials = _per_row(request, C.ADD_SPECIAL_TOKENS, texts.size, True)
    return [codec.encode(_text(t, "text_input"), bool(add)) for t, add in zip(texts, specials)]


def rows_from_request(request, settings: Optional[Settings] = None, codec=None) -> list[Row]:
    """Parse one Triton request (batch b >= 1) into rows; RequestError if malformed.

    Stop token ids are the settings' eos ids (unless ignore_eos) plus the request's
    stop_token_ids; stop strings need the tokenizer."""
    prompts = _prompts(request, codec)
    batch = len(prompts)
    limit = settings.max_total_tokens if settings is not None else 0
    eos = tuple(settings.eos_token_ids) if settings is not None else ()
    new = _per_row(request, C.MAX_NEW_TOKENS, batch, None)
    extras = {name: _per_row(request, name, batch, default)
              for name, default in ((C.TEMPERATURE, 0.0), (C.TOP_P, 1.0), (C.SEED, None), (C.IGNORE_EOS, False))}
    stop_ids = _per_row_lists(request, C.STOP_TOKEN_IDS, batch)
    stop_words = [[_text(w, C.STOP_WORDS) for w in words] for words in _per_row_lists(request, C.STOP_WORDS, batch)]
    if codec is None and any(any(words) for words in stop_words):
        raise RequestError("stop_words need the model's tokenizer, and this repository has none (tokenizer.json)")
    rows = []
    for b, prompt in enumerate(prompts):
        n = new[b] if new[b] is not None else max(limit - prompt.size, 0)
        rows.append(Row(prompt=prompt, max_new_tokens=int(n), temperature=float(extras[C.TEMPERATURE][b]),
                        top_p=float(extras[C.TOP_P][b]),
                        seed=None if extras[C.SEED][b] is None else int(extras[C.SEED][b]),
                        stop_ids=(() if extras[C.IGNORE_EOS][b] else eos) + tuple(int(i) for i in stop_ids[b]),
                        stop_strings=tuple(w for w in stop_words[b] if w)))
    return rows


def _invalid_argument(message: str):
    """A TritonError that clients see as 400 / INVALID_ARGUMENT (when this Triton supports codes)."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


def _wanted(request) -> set:
    """The outputs a request asked for (all when it named none)."""
    names = getattr(request, "requested_output_names", None)
    asked = set(names()) if callable(names) else set()
    return asked or set(C.OUTPUT_NAMES)




def _column(values: list, dtype) -> np.ndarray:
    return np.array([[v] for v in values], dtype=dtype)


def response_tensors(outputs: list, tokens: np.ndarray, wanted: set, text: list) -> list:
    """The tensors of one response: `tokens` [rows, n] (the new tokens), `text` per row."""
    tensors = [pb_utils.Tensor(C.OUTPUT_IDS, tokens.astype(np.int64))]
    if C.TEXT_OUTPUT in wanted:
        tensors.append(pb_utils.Tensor(C.TEXT_OUTPUT, _column([t.encode("utf-8") for t in text], np.object_)))
    if C.FINISH_REASON in wanted:
        tensors.append(pb_utils.Tensor(C.FINISH_REASON,
                                       _column([(o.finish_reason or "").encode() for o in outputs], np.object_)))
    if C.NUM_INPUT_TOKENS in wanted:
        tensors.append(pb_utils.Tensor(C.NUM_INPUT_TOKENS, _column([o.prompt_tokens for o in outputs], np.int32)))
    if C.NUM_OUTPUT_TOKENS in wanted:
        tensors.append(pb_utils.Tensor(C.NUM_OUTPUT_TOKENS, _column([len(o.tokens) for o in outputs], np.int32)))
    return tensors


def _is_probe(request) -> bool:
    """A liveness probe of `wide-export serve` (request parameter wide_probe)."""
    parameters = getattr(request, "parameters", None)
    if not callable(parameters):
        return False
    try:
        return bool(json.loads(parameters() or "{}").get("wide_probe"))
    except (ValueError, AttributeError):
        return False


def finish_reason(outputs: list) -> str:
    """A request's finish reason for the metrics: length if any row ran out of tokens."""
    return "length" if any(o.finish_reason == "length" for o in outputs) else "stop"


class TritonPythonModel:
    """Triton entry point: validates requests, batches valid rows into one generation."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.settings = Settings.load(folder)
        self.codec = load_sibling("textgen").load_codec(folder)
        metrics = load_sibling("metrics")
        self.metrics = metrics.Metrics(pb_utils, config.get("name", args.get("model_name", "")))
        unmetered = metrics.Metrics(None, "")  # `serve`'s liveness probes stay out of the LLM metrics
        self.timer = lambda request: metrics.RequestTimer(unmetered if _is_probe(request) else self.metrics)
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.streaming = bool(pb_utils.using_decoupled_model_transaction_policy(config))
        if self.settings.flavour == "onnxruntime":
            self.step = ort_step(folder, self.settings, int(params.get("intra_op_threads", "0")))
        elif self.settings.flavour == "tensorrt":
            self.step = bls_step(self.settings)
        else:
            raise ValueError(f"unknown flavour {self.settings.flavour!r} in {SETTINGS_FILE}")
        decoding = load_decoding()
        check_device_cache_ops(self.settings, self.step, decoding)  # static batching rebuilds it too (leaves)
        self.scheduler = None
        if self.streaming and params.get("batching", "static") == "inflight":
            batch = decoding.Batch(self.step, self.settings, choose_tokens, max(1, int(config["max_batch_size"])))
            self.scheduler = decoding.Scheduler(batch, _log, observe=self.metrics.gauges).start()

    def finalize(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()

    def _parse(self, request) -> list[Row]:
        rows = rows_from_request(request, self.settings, self.codec)
        for row in rows:
            validate_row(row, self.settings)
        return rows

    def execute(self, requests: list) -> Optional[list]:
        """Every request becomes one decoding.Job: in-flight batching hands them to the scheduler thread;
        static batching runs them together here, start to end (run_static). Decoupled mode answers
        through each request's response sender (None here); otherwise one response per request."""
        responses: list = [None] * len(requests)
        jobs = [job for job in (self._job(request, i, responses) for i, request in enumerate(requests))
                if job is not None]
        if self.scheduler is not None:
            for job in jobs:
                self.scheduler.submit(job)
        elif jobs:
            run_static(self.step, self.settings, jobs, observe=self.metrics.gauges)
        return None if self.streaming else responses

    def _job(self, request, index: int, responses: list):
        """The job of one request, or None after answering a malformed one with its error: streamed (one
        response per new token, then a final empty one) or whole (responses[index] once its rows are done)."""
        timer = self.timer(request)
        wanted = _wanted(request)
        sender = request.get_response_sender() if self.streaming else None
        try:
            rows = self._parse(request)
        except RequestError as err:
            error = pb_utils.InferenceResponse(error=_invalid_argument(str(err)))
            if sender is None:
                responses[index] = error
            else:
                _send(sender, error, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        outputs = row_outputs(rows, self.codec)
        left: list[bool] = []  # the client went away (a token it was sent never reached it)

        def finished() -> None:
            gone = bool(left) or not all(o.done for o in outputs)
            timer.finished("abort" if gone else finish_reason(outputs), sum(o.prompt_tokens for o in outputs),
                           sum(len(o.tokens) for o in outputs))

        if sender is None:
            def emit(fresh: list) -> bool:
                return True

            def finish(error: Optional[str]) -> None:
                if error is not None:
                    responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(error))
                    return
                responses[index] = pb_utils.InferenceResponse(output_tensors=response_tensors(
                    outputs, padded_tokens(outputs, self.settings.pad_token_id), wanted,
                    [o.take_text() for o in outputs]))
                timer.token()
                finished()
        else:
            def emit(fresh: list) -> bool:
                sent = _send(sender, self._stream_response(outputs, fresh, wanted))
                if sent:
                    timer.token()
                else:
                    left.append(True)
                return sent

            def finish(error: Optional[str]) -> None:
                last = None if error is None else pb_utils.InferenceResponse(error=pb_utils.TritonError(error))
                finished()
                _send(sender, last, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL, even_if_cancelled=True)

        return load_decoding().Job(rows=rows, emit=emit, finish=finish, outputs=outputs, on_admit=timer.admitted)

    def _stream_response(self, outputs: list, fresh: list, wanted: set):
        """One streamed response: each row's token of this step (pad for rows that ended before)."""
        tokens = np.array([[self.settings.pad_token_id if t is None else t] for t in fresh], dtype=np.int64)
        text = [o.take_text() if C.TEXT_OUTPUT in wanted else "" for o in outputs]
        return pb_utils.InferenceResponse(output_tensors=response_tensors(outputs, tokens, wanted, text))


def _log(message: str) -> None:
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info(message)


def _send(sender, response, flags: int = 0, even_if_cancelled: bool = False) -> bool:
    """Send on a decoupled response sender; False when the client has gone (cancelled or closed).

    A cancelled request gets no more tokens, but still its final flag (`even_if_cancelled`),
    which releases it in the server.
    """
    is_cancelled = getattr(sender, "is_cancelled", None)
    try:
        if is_cancelled is not None and is_cancelled():
            if not even_if_cancelled:
                return False
            response = None
        if response is None:
            sender.send(flags=flags)
        else:
            sender.send(response, flags=flags)
        return True
    except Exception:  # noqa: BLE001 - a closed stream must not stop the other requests
        return False
