"""Serving: the OpenAI front door (openai/, which knows only the Engine protocol), the engines behind it (Triton
Inference Server, the CPU generator) and the server lifecycles of `wide-export serve`."""
