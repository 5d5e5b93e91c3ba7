"""WIDE generation model for Triton's Python backend (copied as `<model>/1/model.py`).

Self-contained on purpose (numpy, onnxruntime, Triton's pb_utils; `tokenizers` for text): a
generated repository must run where wide_export is not installed. Its siblings contract.py (the
names, dtypes and shapes of its inputs and outputs), inflight.py (in-flight batching), textgen.py
(tokenizer, stop rules, streamed text) and metrics.py (Prometheus metrics through
pb_utils.MetricFamily) are copied beside it.

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
`--streaming`): execute() hands requests to a scheduler thread (inflight.py
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
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (unit tests, direct use)
    pb_utils = None

SETTINGS_FILE = "generation.json"
NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}


class RequestError(ValueError):
    """A malformed request: answered with an error, the model keeps serving."""


@dataclass
class Row:
    """One prompt to continue, with its own sampling settings."""

    prompt: np.ndarray
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop_ids: tuple = ()  # the eos ids (unless ignore_eos) and the request's stop token ids
    stop_strings: tuple = ()


@dataclass
class Settings:
    """What generation.json says (see wide_export/triton/repository.py)."""

    flavour: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: str
    max_total_tokens: int
    io: dict
    max_prompt_tokens: int = 0  # 0: only max_total_tokens limits the prompt
    onnx_file: str = "model.onnx"
    engine_model: str = ""  # tensorrt: the tensorrt_plan model serving both phases
    prefill_model: str = ""  # tensorrt, engines split across files (and repositories before engine_model)
    decode_model: str = ""
    kv_cache_memory: str = "gpu"  # tensorrt: "gpu" (BLS outputs in GPU memory) or "cpu" (host numpy)
    eos_token_ids: list = field(default_factory=list)  # generation stops at any of them
    pad_token_id: int = 0  # fills output_ids of rows that ended before the others

    @classmethod
    def load(cls, folder: str) -> "Settings":
        path = os.path.join(folder, SETTINGS_FILE)
        with open(path) as f:
            raw = json.load(f)
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{path}: unknown settings {unknown} (written by a newer wide-export?)")
        settings = cls(**raw)
        if settings.kv_cache_memory not in ("gpu", "cpu"):
            raise ValueError(f"{path}: kv_cache_memory must be \"gpu\" or \"cpu\", got {settings.kv_cache_memory!r}")
        if settings.flavour == "tensorrt" and not (settings.engine_model
                                                   or (settings.prefill_model and settings.decode_model)):
            raise ValueError(f"{path}: the tensorrt flavour needs engine_model (or prefill_model and decode_model)")
        return settings

    def model_for(self, phase: str) -> str:
        """The tensorrt_plan model a BLS request of this phase goes to."""
        named = self.prefill_model if phase == "prefill" else self.decode_model
        return named or self.engine_model

    def past_names(self) -> list[tuple[str, str]]:
        """(key, value) input names per layer."""
        key, value = self.io["past_key"], self.io["past_value"]
        return [(key.format(i=i), value.format(i=i)) for i in range(self.num_layers)]

    def present_names(self) -> list[tuple[str, str]]:
        """(key, value) output names per layer."""
        key, value = self.io["present_key"], self.io["present_value"]
        return [(key.format(i=i), value.format(i=i)) for i in range(self.num_layers)]


# A step runs the graph once: (feeds by input name) -> (logits, presents in layer order).
StepFn = Callable[[dict, str], tuple]
# Called after every decode step with (step index, that step's token per row [rows]);
# returning False stops the generation (nobody is listening any more).
OnStep = Callable[[int, np.ndarray], bool]


def validate_row(row: Row, settings: Settings) -> None:
    """Raise RequestError for anything the model cannot serve."""
    if row.prompt.ndim != 1 or row.prompt.size == 0:
        raise RequestError("input_ids is empty: send at least one prompt token")
    if row.prompt.size >= settings.max_total_tokens:
        raise RequestError(f"prompt ({row.prompt.size} tokens) + one new token exceeds the model's limit of "
                           f"{settings.max_total_tokens} tokens")
    if row.max_new_tokens <= 0:
        raise RequestError(f"max_new_tokens must be >= 1, got {row.max_new_tokens}")
    total = row.prompt.size + row.max_new_tokens
    if total > settings.max_total_tokens:
        raise RequestError(
            f"prompt ({row.prompt.size} tokens) + max_new_tokens ({row.max_new_tokens}) = {total} "
            f"exceeds the model's limit of {settings.max_total_tokens} tokens"
        )
    if settings.max_prompt_tokens and row.prompt.size > settings.max_prompt_tokens:
        raise RequestError(
            f"prompt has {row.prompt.size} tokens, the engine's prefill allows {settings.max_prompt_tokens}")
    low, high = int(row.prompt.min()), int(row.prompt.max())
    if low < 0 or high >= settings.vocab_size:
        raise RequestError(f"input_ids must lie in [0, {settings.vocab_size}), got values in [{low}, {high}]")
    if not np.isfinite(row.temperature) or row.temperature < 0:
        raise RequestError(f"temperature must be >= 0, got {row.temperature}")
    if not (0.0 < row.top_p <= 1.0):
        raise RequestError(f"top_p must be in (0, 1], got {row.top_p}")
    if row.seed is not None and row.seed < 0:
        raise RequestError(f"seed must be >= 0, got {row.seed}")


def choose_tokens(logits: np.ndarray, rows: list[Row], rngs: list[np.random.Generator]) -> np.ndarray:
    """Next token per row: argmax when temperature is 0, else temperature/top-p sampling."""
    out = np.argmax(logits, axis=-1).astype(np.int64)
    for b, row in enumerate(rows):
        if row.temperature <= 0:
            continue
        z = logits[b].astype(np.float64) / row.temperature
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, row.top_p) + 1)]  # smallest set reaching top_p
        kept = probs[keep] / probs[keep].sum()
        out[b] = keep[rngs[b].choice(keep.size, p=kept)]
    return out


def row_outputs(rows: list[Row], codec=None) -> list:
    """One textgen.RowOutput per row: its stop rule, finish reason and text."""
    textgen = load_sibling("textgen")
    return [textgen.RowOutput(r.prompt, r.max_new_tokens, r.stop_ids, r.stop_strings, codec) for r in rows]


def generate(step: StepFn, settings: Settings, rows: list[Row], outputs: Optional[list] = None,
             on_step: Optional[OnStep] = None) -> list:
    """Prefill all rows together (left-padded), then decode with the KV cache until every row is
    done (its output's stop rule). `on_step(s, fresh)` sees, per row, the token it chose at step
    `s` or None for a row that ended earlier (fed pad_token_id from then on, its choices ignored).
    Returns each row's new tokens; `outputs` (default: length-only row_outputs) hold them too."""
    outputs = row_outputs(rows) if outputs is None else outputs
    batch = len(rows)
    longest = max(r.prompt.size for r in rows)
    steps = max(r.max_new_tokens for r in rows)
    ids = np.zeros((batch, longest), dtype=np.int64)
    mask = np.zeros((batch, longest), dtype=np.int64)
    for b, row in enumerate(rows):
        ids[b, longest - row.prompt.size:] = row.prompt
        mask[b, longest - row.prompt.size:] = 1
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    kv_dtype = NP_DTYPES[settings.kv_dtype]
    empty = np.zeros((batch, settings.num_kv_heads, 0, settings.head_dim), dtype=kv_dtype)
    past = [(empty, empty) for _ in range(settings.num_layers)]
    rngs = [np.random.default_rng(r.seed) for r in rows]
    phase = "prefill"
    for s in range(steps):
        feeds = {settings.io["input_ids"]: ids, settings.io["attention_mask"]: mask,
                 settings.io["position_ids"]: positions}
        for (k_name, v_name), (k, v) in zip(settings.past_names(), past):
            feeds[k_name], feeds[v_name] = k, v
        logits, past = step(feeds, phase)
        chosen = choose_tokens(logits[:, -1, :], rows, rngs)
        fresh: list = [None] * batch
        for b, out in enumerate(outputs):
            if not out.done:
                out.add(int(chosen[b]))
                fresh[b] = int(chosen[b])
        if on_step is not None and not on_step(s, fresh):
            break
        if all(out.done for out in outputs):
            break
        phase = "decode"
        ids = np.array([[settings.pad_token_id if t is None else t] for t in fresh], dtype=np.int64)
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        positions = mask.sum(axis=1, keepdims=True) - 1
    return [np.array(out.tokens, dtype=np.int64) for out in outputs]


def padded_groups(rows: list[Row], max_total_tokens: int) -> list[list[int]]:
    """Split row indices into groups whose padded length (longest prompt + most new tokens)
    fits the model's limit; each row alone fits (validate_row checked it)."""
    groups: list[list[int]] = []
    longest = steps = 0
    for i, row in enumerate(rows):
        new_longest, new_steps = max(longest, row.prompt.size), max(steps, row.max_new_tokens)
        if groups and new_longest + new_steps <= max_total_tokens:
            groups[-1].append(i)
            longest, steps = new_longest, new_steps
        else:
            groups.append([i])
            longest, steps = row.prompt.size, row.max_new_tokens
    return groups


def generate_all(step: StepFn, settings: Settings, rows: list[Row], outputs: Optional[list] = None,
                 on_step: Optional[Callable[[list[int], int, list], bool]] = None) -> list:
    """generate() over as few batches as the length limit allows; new tokens in row order.

    `on_step(row indices, step, fresh)` sees each batch's tokens as they are chosen.
    """
    outputs = row_outputs(rows) if outputs is None else outputs
    for group in padded_groups(rows, settings.max_total_tokens):
        watch = None if on_step is None else (lambda s, fresh, group=group: on_step(group, s, fresh))
        generate(step, settings, [rows[i] for i in group], [outputs[i] for i in group], watch)
    return [np.array(out.tokens, dtype=np.int64) for out in outputs]


def padded_tokens(outputs: list, pad: int) -> np.ndarray:
    """[rows, longest] output ids; rows that ended earlier are padded with `pad`."""
    longest = max(len(out.tokens) for out in outputs)
    block = np.full((len(outputs), longest), pad, dtype=np.int64)
    for b, out in enumerate(outputs):
        block[b, :len(out.tokens)] = out.tokens
    return block


def ort_step(folder: str, settings: Settings, threads: int = 0) -> StepFn:
    """A step function running model.onnx in ONNX Runtime (CUDA EP when available).

    I/O goes through an IOBinding: `present.*` outputs are left where the
    execution provider wrote them (OrtValues on the GPU with the CUDA EP) and
    are bound as the next step's `past_key_values.*` inputs, so the KV cache
    never crosses the PCIe bus. Only input_ids / attention_mask / position_ids
    go in and `logits` comes back to host memory (the sampler runs in numpy).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads > 0:
        options.intra_op_num_threads = threads
    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    session = ort.InferenceSession(os.path.join(folder, settings.onnx_file), options, providers=providers)
    device = "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
    present = [n for pair in settings.present_names() for n in pair]

    def step(feeds: dict, phase: str) -> tuple:
        binding = session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, ort.OrtValue):  # a previous step's present, already on the device
                binding.bind_ortvalue_input(name, value)
            elif isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            else:  # a torch tensor the in-flight batch built on the device: bound where it lies
                _bind_torch_input(binding, name, value)
        binding.bind_output(settings.io["logits"], "cpu")
        for name in present:
            binding.bind_output(name, device)
        session.run_with_iobinding(binding)
        outs = binding.get_outputs()
        presents = [(outs[1 + 2 * i], outs[2 + 2 * i]) for i in range(settings.num_layers)]
        return outs[0].numpy(), presents

    step.device = device
    return step


def _bind_torch_input(binding, name: str, tensor) -> None:
    """Bind a (C-contiguous) torch tensor as an input by pointer, on its own device: no copy.
    IOBinding.bind_input(name, device_type, device_id, element_type, shape, buffer_ptr); the
    caller's feeds keep the tensor alive until the run ends."""
    if not tensor.is_contiguous():  # a copy made here would be freed before the run
        raise ValueError(f"{name}: cache tensor is not contiguous")
    dtype = np.dtype(str(tensor.dtype).replace("torch.", ""))
    device = tensor.device
    binding.bind_input(name, device.type, device.index or 0, dtype, list(tensor.shape), tensor.data_ptr())


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


def check_device_cache_ops(settings: Settings, step: StepFn, inflight) -> None:
    """In-flight batching with the KV cache on a device rebuilds it there (PyTorch over DLPack):
    fail at model load, with the way out, rather than at the first join."""
    if settings.flavour == "onnxruntime":
        if getattr(step, "device", "cpu") == "cpu":
            return
        import onnxruntime as ort

        if not callable(getattr(ort.OrtValue, "__dlpack__", None)):
            raise RuntimeError(f"in-flight batching on {step.device} needs OrtValue.__dlpack__, which onnxruntime "
                               f"{ort.__version__} lacks: upgrade onnxruntime (1.32 has it) in the server's Python")
    elif settings.kv_cache_memory != "gpu":
        return
    inflight.TorchCacheOps()  # RuntimeError when PyTorch is missing


def load_sibling(name: str):
    """A module of this folder (contract.py, inflight.py, textgen.py, metrics.py: in the package and in a
    repository)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    key = f"wide_{name}_{abs(hash(path))}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[key]


C = load_sibling("contract")  # the I/O contract: every tensor name this model reads and writes


def load_inflight():
    """The in-flight batching module (inflight.py beside this file)."""
    return load_sibling("inflight")


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
        self.scheduler = None
        if self.streaming and params.get("batching", "static") == "inflight":
            inflight = load_inflight()
            check_device_cache_ops(self.settings, self.step, inflight)
            batch = inflight.Batch(self.step, self.settings, choose_tokens, max(1, int(config["max_batch_size"])))
            self.scheduler = inflight.Scheduler(batch, _log, observe=self.metrics.gauges).start()

    def finalize(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()

    def _parse(self, request) -> list[Row]:
        rows = rows_from_request(request, self.settings, self.codec)
        for row in rows:
            validate_row(row, self.settings)
        return rows

    def execute(self, requests: list) -> Optional[list]:
        if self.scheduler is not None:
            self._submit(requests)
            return None
        if self.streaming:
            self._stream(requests)
            return None
        responses: list = [None] * len(requests)
        parsed: list[tuple[int, list[Row], object]] = []
        for i, request in enumerate(requests):
            try:
                parsed.append((i, self._parse(request), self.timer(request)))
            except RequestError as err:
                responses[i] = pb_utils.InferenceResponse(error=_invalid_argument(str(err)))
        if parsed:
            all_rows = [row for _, rows, _ in parsed for row in rows]
            outputs = row_outputs(all_rows, self.codec)
            self.metrics.gauges(len(all_rows), 0)
            for _, _, timer in parsed:
                timer.admitted()
            try:
                generate_all(self.step, self.settings, all_rows, outputs)
            except Exception as err:  # noqa: BLE001 - report to every client, keep serving
                for i, _, _ in parsed:
                    responses[i] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"generation failed: {err}"))
                return responses
            finally:
                self.metrics.gauges(0, 0)
            start = 0
            for i, rows, timer in parsed:
                outs = outputs[start:start + len(rows)]
                start += len(rows)
                responses[i] = pb_utils.InferenceResponse(output_tensors=response_tensors(
                    outs, padded_tokens(outs, self.settings.pad_token_id), _wanted(requests[i]),
                    [o.take_text() for o in outs]))
                timer.token()
                timer.finished(finish_reason(outs), sum(o.prompt_tokens for o in outs),
                               sum(len(o.tokens) for o in outs))
        return responses

    def _accept(self, request, sender) -> Optional[list]:
        """A decoupled request's validated rows, or None after answering it with the error (final)."""
        try:
            return self._parse(request)
        except RequestError as err:
            _send(sender, pb_utils.InferenceResponse(error=_invalid_argument(str(err))),
                  pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None

    def _stream_response(self, outputs: list, fresh: list, wanted: set):
        """One streamed response: each row's token of this step (pad for rows that ended before)."""
        tokens = np.array([[self.settings.pad_token_id if t is None else t] for t in fresh], dtype=np.int64)
        text = [o.take_text() if C.TEXT_OUTPUT in wanted else "" for o in outputs]
        return pb_utils.InferenceResponse(output_tensors=response_tensors(outputs, tokens, wanted, text))

    def _submit(self, requests: list) -> None:
        """In-flight batching: valid requests go to the scheduler thread, which streams their tokens."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            timer = self.timer(request)
            sender = request.get_response_sender()
            rows = self._accept(request, sender)
            if rows is None:
                continue
            outputs = row_outputs(rows, self.codec)
            wanted = _wanted(request)

            def emit(fresh: list, sender=sender, outputs=outputs, wanted=wanted, timer=timer) -> bool:
                sent = _send(sender, self._stream_response(outputs, fresh, wanted))
                if sent:
                    timer.token()
                return sent

            def finish(error: Optional[str], sender=sender, outputs=outputs, timer=timer) -> None:
                last = None if error is None else pb_utils.InferenceResponse(error=pb_utils.TritonError(error))
                gone = not all(o.done for o in outputs)
                timer.finished("abort" if gone else finish_reason(outputs), sum(o.prompt_tokens for o in outputs),
                               sum(len(o.tokens) for o in outputs))
                _send(sender, last, final, even_if_cancelled=True)

            self.scheduler.submit(load_inflight().Job(rows=rows, emit=emit, finish=finish, outputs=outputs,
                                                      on_admit=timer.admitted))

    def _stream(self, requests: list) -> None:
        """Decoupled mode, static batching: each request gets one response per new token, then a
        final empty one as soon as its rows are done."""
        streams: list[_Stream] = []
        all_rows: list[Row] = []
        for request in requests:
            timer = self.timer(request)
            sender = request.get_response_sender()
            rows = self._accept(request, sender)
            if rows is None:
                continue
            streams.append(_Stream(sender, list(range(len(all_rows), len(all_rows) + len(rows))),
                                   _wanted(request), timer))
            all_rows.extend(rows)
        if not streams:
            return
        outputs = row_outputs(all_rows, self.codec)
        owner = {i: stream for stream in streams for i in stream.rows}
        for stream in streams:
            stream.timer.admitted()
        self.metrics.gauges(len(all_rows), 0)

        def on_step(group: list[int], s: int, fresh: list) -> bool:
            # A request's rows share a shape, so they are always generated in the same batch.
            alive = False
            for stream in {id(owner[i]): owner[i] for i in group}.values():
                if stream.closed:
                    continue
                outs = [outputs[i] for i in stream.rows]
                picked = [fresh[group.index(i)] for i in stream.rows]
                if not _send(stream.sender, self._stream_response(outs, picked, stream.wanted)):
                    stream.gone = True
                    _log(f"streaming client went away after {len(outs[0].tokens) - 1} of "
                         f"{all_rows[stream.rows[0]].max_new_tokens} tokens; "
                         "its rows are no longer decoded")
                    self._close(stream, outs)
                    continue
                stream.timer.token()
                if all(o.done for o in outs):
                    self._close(stream, outs)
                    continue
                alive = True
            return alive

        failure = None
        try:
            generate_all(self.step, self.settings, all_rows, outputs, on_step)
        except Exception as err:  # noqa: BLE001 - report to every client, keep serving
            failure = pb_utils.TritonError(f"generation failed: {err}")
        finally:
            self.metrics.gauges(0, 0)
        for stream in streams:  # every request is closed, also those whose client left
            if not stream.closed:
                last = None if failure is None or stream.gone else pb_utils.InferenceResponse(error=failure)
                self._close(stream, [outputs[i] for i in stream.rows], last)

    def _close(self, stream: "_Stream", outs: list, last=None) -> None:
        stream.closed = True
        gone = stream.gone or not all(o.done for o in outs)
        stream.timer.finished("abort" if gone else finish_reason(outs), sum(o.prompt_tokens for o in outs),
                              sum(len(o.tokens) for o in outs))
        _send(stream.sender, last, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL, even_if_cancelled=True)


def _log(message: str) -> None:
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info(message)


@dataclass
class _Stream:
    """One streaming request: where its responses go, which rows are its own, what it asked for."""

    sender: object
    rows: list
    wanted: set
    timer: object
    gone: bool = False
    closed: bool = False


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
