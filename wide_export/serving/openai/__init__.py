"""An OpenAI-compatible HTTP front door for a served model repository.

`wide-export serve --openai-port PORT` starts it beside tritonserver: FastAPI
routes (`app`) on uvicorn in a background thread (`runner`), talking to
tritonserver over gRPC (`engine.TritonEngine`). Request schemas are in
`protocol`, errors in OpenAI's shape in `errors`, chat templates in `chat`,
the repository's models in `models`.

Nothing heavy is imported here: FastAPI, uvicorn, transformers and
tritonclient load only when a frontend is built, so `wide-export --help` stays
instant.
"""
