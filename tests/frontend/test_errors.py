"""serving/openai/errors.py by itself: OpenAI's error shape, the status -> type table, pydantic locations as
`param`, and which message a list of validation errors becomes (written out by hand per case).

The wording is the contract here: the error body's whole shape ({"error": {message, type, param, code}}) and
OpenAI's own model_not_found sentence are what OpenAI clients read, so they are pinned whole, here only (other
frontend tests assert the status, type and param, and the fact a message names). from_validation's cases pin
how it joins pydantic's messages (`field: a or b`), the composition being what it is for."""

from __future__ import annotations

import pytest

from wide_export.serving.openai.errors import OpenAIError, bad_request, from_validation, model_not_found, param_of


@pytest.mark.parametrize("status, type_", [(400, "invalid_request_error"), (404, "invalid_request_error"),
                                           (405, "invalid_request_error"), (503, "service_unavailable"),
                                           (500, "server_error"), (502, "server_error"), (599, "server_error"),
                                           (409, "invalid_request_error"), (499, "invalid_request_error")])
def test_error_type_follows_the_status(status, type_):
    err = OpenAIError(status, "m")
    assert err.type == type_ and err.status == status
    assert err.body() == {"error": {"message": "m", "type": type_, "param": None, "code": None}}
    assert str(err) == "m"


def test_explicit_type_param_and_code():
    err = OpenAIError(429, "slow down", param="x", code="rate", type="rate_limit_error")
    assert err.body() == {"error": {"message": "slow down", "type": "rate_limit_error", "param": "x", "code": "rate"}}


def test_helpers():
    assert bad_request("no", param="p", code="c").body() == {
        "error": {"message": "no", "type": "invalid_request_error", "param": "p", "code": "c"}}
    assert bad_request("no").status == 400
    err = model_not_found("gpt-9")
    assert (err.status, err.param, err.code, err.message) == (404, "model", "model_not_found",
                                                             "The model `gpt-9` does not exist.")


@pytest.mark.parametrize("loc, param", [
    (("body", "messages", 0, "role"), "messages[0].role"),
    (("body", "messages", 2, "content", 1), "messages[2].content[1]"),
    (("body", "stop", "str"), "stop"),
    (("body", "stop", "list[str]", 3), "stop[3]"),
    (("body", "prompt", "list[list[int]]", 0, 1), "prompt[0][1]"),
    (("body", "max_tokens", "int"), "max_tokens"),
    (("body", "stream_options", "function-after", "include_usage"), "stream_options.include_usage"),
    (("body", "x", "none"), "x"),
    (("body", "x", "bool"), "x"),
    (("body", "x", "float"), "x"),
    (("body", "x", "dict"), "x"),
    (("body", "x", "list"), "x"),
    (("body", "x", "function-before"), "x"),
    (("query", "limit"), "query.limit"),
    (("str",), "str"),  # a first part is always a field
    (("body",), None),
    ((), None),
])
def test_param_of_pydantic_locations(loc, param):
    assert param_of(loc) == param


def test_no_errors_is_a_generic_400():
    err = from_validation([])
    assert (err.status, err.message, err.param) == (400, "invalid request", None)


def test_invalid_json_names_the_decoder_error():
    err = from_validation([{"type": "json_invalid", "loc": ("body", 1), "msg": "JSON decode error",
                            "ctx": {"error": "Expecting value"}}])
    assert "not valid JSON" in err.message and err.message.endswith(": Expecting value") and err.param is None
    err = from_validation([{"type": "json_invalid", "loc": ("body", 1), "msg": "JSON decode error"}])
    assert "not valid JSON" in err.message and err.message.endswith(": JSON decode error")


@pytest.mark.parametrize("kind", ["model_attributes_type", "dict_type", "model_type"])
def test_a_body_that_is_not_an_object(kind):
    err = from_validation([{"type": kind, "loc": ("body",), "msg": "Input should be a valid dictionary"}])
    assert "JSON object" in err.message and err.param is None


def test_a_field_of_another_type_at_the_top_is_not_called_a_non_object():
    err = from_validation([{"type": "string_type", "loc": ("body",), "msg": "Input should be a valid string"}])
    assert (err.message, err.param) == ("Input should be a valid string", None)


def test_our_own_checks_keep_their_message_and_param():
    err = from_validation([{"type": "invalid_request", "loc": ("body",), "msg": "n=3 is not supported",
                            "ctx": {"param": "n", "message": "n=3 is not supported"}}])
    assert (err.message, err.param, err.status) == ("n=3 is not supported", "n", 400)


def test_a_union_names_what_each_member_wanted():
    errors = [{"type": "string_type", "loc": ("body", "stop", "str"), "msg": "Input should be a valid string"},
              {"type": "list_type", "loc": ("body", "stop", "list[str]"), "msg": "Input should be a valid list"},
              {"type": "int_type", "loc": ("body", "max_tokens"), "msg": "Input should be a valid integer"}]
    err = from_validation(errors)
    assert err.param == "stop"
    assert err.message == "stop: Input should be a valid string or Input should be a valid list"


def test_repeated_messages_once_and_value_error_prefix_dropped():
    errors = [{"type": "value_error", "loc": ("body", "t"), "msg": "Value error, too big"},
              {"type": "value_error", "loc": ("body", "t", "int"), "msg": "Value error, too big"}]
    assert from_validation(errors).message == "t: too big"


def test_more_than_three_member_messages_keep_only_the_first():
    errors = [{"type": f"t{i}", "loc": ("body", "prompt", tag), "msg": f"wanted {i}"}
              for i, tag in enumerate(["str", "list[str]", "list[int]", "list[list[int]]"])]
    assert from_validation(errors).message == "prompt: wanted 0"
    assert from_validation(errors[:3]).message == "prompt: wanted 0 or wanted 1 or wanted 2"


def test_a_message_without_a_field_or_text():
    err = from_validation([{"type": "missing", "loc": ()}])
    assert (err.message, err.param) == ("invalid value", None)


def test_a_ctx_param_groups_errors_as_their_field():
    errors = [{"type": "x", "loc": ("body", "a"), "msg": "first", "ctx": {"param": "b"}},
              {"type": "y", "loc": ("body", "b"), "msg": "second"},
              {"type": "z", "loc": ("body", "a"), "msg": "third"}]
    err = from_validation(errors)
    assert err.param == "b" and err.message == "b: first or second"


def test_errors_without_a_location():
    """FastAPI/pydantic errors may come without `loc`: no field, the message alone."""
    err = from_validation([{"type": "missing", "msg": "Field required"}])
    assert (err.message, err.param) == ("Field required", None)
    err = from_validation([{"type": "a", "msg": "first"}, {"type": "b", "msg": "second", "loc": ("body", "x")}])
    assert (err.message, err.param) == ("first", None)
