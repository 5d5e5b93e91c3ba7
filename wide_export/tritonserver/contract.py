"""The generation model's I/O contract: the name, Triton dtype and shape of every tensor a request may send and
a response carries. The one place they are written: the repository's config.pbtxt is rendered from it
(repository.py), the in-server model (generation_model.py) reads and writes these names, the tritonclient
wrapper (client.py) and the OpenAI engine (serving/openai/engine.py) send and read them.

Standard library only: copied beside the generation model (REPO/<model>/1/contract.py), where wide_export
is not installed.

Inputs (one prompt per row): input_ids [batch, tokens] or text_input [batch, 1] (tokenizer.json); optional
per-row settings [batch, 1]; stop_token_ids / stop_words [batch, n]. Outputs: output_ids [batch, new tokens],
text_output, finish_reason ("stop" / "length"), num_input_tokens / num_output_tokens.
"""

from __future__ import annotations

from typing import NamedTuple


class Tensor(NamedTuple):
    name: str
    dtype: str  # Triton's name (config.pbtxt: TYPE_<dtype>, tritonclient: <dtype>; STRING is BYTES there)
    dims: tuple  # per row (config.pbtxt dims; the batch dimension comes first on the wire)
    optional: bool = False
    ragged: bool = False  # rows of different lengths (allow_ragged_batch)

    @property
    def client_dtype(self) -> str:
        """The dtype as tritonclient names it."""
        return "BYTES" if self.dtype == "STRING" else self.dtype


INPUT_IDS = "input_ids"
TEXT_INPUT = "text_input"
ADD_SPECIAL_TOKENS = "add_special_tokens"
MAX_NEW_TOKENS = "max_new_tokens"
TEMPERATURE = "temperature"
TOP_P = "top_p"
SEED = "seed"
STOP_TOKEN_IDS = "stop_token_ids"
STOP_WORDS = "stop_words"
IGNORE_EOS = "ignore_eos"

OUTPUT_IDS = "output_ids"
TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"

INPUTS = (
    Tensor(INPUT_IDS, "INT64", (-1,), optional=True, ragged=True),
    Tensor(TEXT_INPUT, "STRING", (1,), optional=True),
    Tensor(ADD_SPECIAL_TOKENS, "BOOL", (1,), optional=True),
    Tensor(MAX_NEW_TOKENS, "INT32", (1,), optional=True),
    Tensor(TEMPERATURE, "FP32", (1,), optional=True),
    Tensor(TOP_P, "FP32", (1,), optional=True),
    Tensor(SEED, "INT64", (1,), optional=True),
    Tensor(STOP_TOKEN_IDS, "INT64", (-1,), optional=True, ragged=True),
    Tensor(STOP_WORDS, "STRING", (-1,), optional=True, ragged=True),
    Tensor(IGNORE_EOS, "BOOL", (1,), optional=True),
)
OUTPUTS = (
    Tensor(OUTPUT_IDS, "INT64", (-1,)),
    Tensor(TEXT_OUTPUT, "STRING", (1,)),
    Tensor(FINISH_REASON, "STRING", (1,)),
    Tensor(NUM_INPUT_TOKENS, "INT32", (1,)),
    Tensor(NUM_OUTPUT_TOKENS, "INT32", (1,)),
)
OUTPUT_NAMES = tuple(t.name for t in OUTPUTS)
BY_NAME = {t.name: t for t in (*INPUTS, *OUTPUTS)}


def client_dtype(name: str) -> str:
    """The tritonclient dtype of a contract tensor."""
    return BY_NAME[name].client_dtype


def pbtxt(tensors) -> str:
    """The config.pbtxt list entries of `tensors` (one per line, comma-separated, as Triton's examples)."""
    lines = []
    for t in tensors:
        dims = ", ".join(str(d) for d in t.dims)
        entry = f'{{ name: "{t.name}" data_type: TYPE_{t.dtype} dims: [ {dims} ]'
        entry += " optional: true" if t.optional else ""
        entry += " allow_ragged_batch: true" if t.ragged else ""
        lines.append(f"  {entry} }}")
    return ",\n".join(lines)
