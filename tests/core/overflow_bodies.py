"""Real upstream error bodies, verbatim, with where each wording comes from.

Each case: ``(name, status, body, expected)`` where ``expected`` is the dict of ContextOverflow
fields the classifier must produce (only the fields listed are checked), or ``None`` for bodies that
must NOT be classified as a context overflow. Numbers inside a wording are the ones of the cited
capture; where a source gives a format string, the numbers are filled in by us.
"""

from __future__ import annotations

from typing import Any

Case = tuple[str, int, Any, dict[str, Any] | None]

OVERFLOW_CASES: list[Case] = [
    # OpenAI chat completions, the classic body (code context_length_exceeded, param messages), as
    # captured by OpenAI-compatible fakes and clients; wording "This model's maximum context length
    # is N tokens. However, your messages resulted in M tokens. Please reduce the length of the
    # messages." appears verbatim across openai-python users' reports.
    (
        "openai_messages",
        400,
        b'{"error":{"message":"This model\'s maximum context length is 128000 tokens. However, your '
        b'messages resulted in 130021 tokens. Please reduce the length of the messages.",'
        b'"type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}',
        {"dialect": "openai", "limit_tokens": 128000, "prompt_tokens": 130021, "output_tokens": None},
    ),
    # OpenAI GPT-5 family input cap (272000 input tokens), wording as reported by API users:
    # "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 300007
    # tokens. Please reduce the length of the messages."
    (
        "openai_configured_limit",
        400,
        {
            "error": {
                "message": "Input tokens exceed the configured limit of 272000 tokens. Your messages "
                "resulted in 300007 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        {"dialect": "openai", "limit_tokens": 272000, "prompt_tokens": 300007, "output_tokens": 0},
    ),
    # OpenAI Responses-style wording under the same code.
    (
        "openai_responses_wording",
        400,
        '{"error":{"message":"Your input exceeds the context window of this model. Please adjust your '
        'input and try again.","type":"invalid_request_error","param":"input",'
        '"code":"context_length_exceeded"}}',
        {"dialect": "openai", "limit_tokens": None, "prompt_tokens": None},
    ),
    # Structure alone: OpenAI's code with a message we do not know.
    (
        "openai_code_only",
        400,
        {
            "error": {
                "message": "too long",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
        {"dialect": "openai", "limit_tokens": None, "message": "too long"},
    ),
    # Old OpenAI / old vLLM / DeepSeek split wording. vLLM issue #20409 (vllm-project/vllm) title:
    # "ValueError: This model's maximum context length is 16384 tokens. However, you requested
    # 122946 tokens (112946 in the messages, 10000 in the completion). Please reduce the length of
    # the messages or completion."
    (
        "vllm_old_split",
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 16384 tokens. However, you requested 122946 "
            "tokens (112946 in the messages, 10000 in the completion). Please reduce the length of the "
            "messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        {
            "dialect": "vllm",
            "limit_tokens": 16384,
            "prompt_tokens": 112946,
            "output_tokens": 10000,
            "requested_tokens": 122946,
        },
    ),
    # The same old wording under OpenAI's code: the structure names the dialect.
    (
        "openai_old_split",
        400,
        {
            "error": {
                "message": "This model's maximum context length is 4097 tokens. However, you requested 4162 "
                "tokens (3162 in the messages, 1000 in the completion). Please reduce the length of the "
                "messages or completion.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        {"dialect": "openai", "limit_tokens": 4097, "prompt_tokens": 3162, "output_tokens": 1000},
    ),
    # vLLM >= 0.16: vllm/renderers/params.py TokenizeParams._token_len_check (vllm-project/vllm),
    # wire body (VLLMValidationError rendered with "(parameter=..., value=...)") as captured by users.
    (
        "vllm_renderer_passed",
        400,
        b'{"error":{"message":"You passed 131073 input tokens and requested 0 output tokens. However, '
        b"the model's context length is only 131072 tokens, resulting in a maximum input length of "
        b"131072 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        b'value=131073)","type":"BadRequestError","param":"input_tokens","code":400}}',
        {"dialect": "vllm", "limit_tokens": 131072, "prompt_tokens": 131073, "output_tokens": 0},
    ),
    (
        "vllm_renderer_passed_with_output",
        400,
        {
            "error": {
                "message": "You passed 7681 input tokens and requested 512 output tokens. However, the "
                "model's context length is only 8192 tokens, resulting in a maximum input length of 7680 "
                "tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=7681)",
                "type": "BadRequestError",
                "param": "input_tokens",
                "code": 400,
            }
        },
        {
            "dialect": "vllm",
            "limit_tokens": 8192,
            "prompt_tokens": 7681,
            "output_tokens": 512,
            "requested_tokens": 8193,
        },
    ),
    # vLLM >= 0.16, vllm/renderers/params.py TokenizeParams._text_len_check: characters, no token count.
    (
        "vllm_renderer_characters",
        400,
        {
            "error": {
                "message": "You passed 900000 input characters and requested 1024 output tokens. However, "
                "the model's context length is only 32768 tokens, resulting in a maximum input length of "
                "31744 tokens (at most 507904 characters). Please reduce the length of the input prompt. "
                "(parameter=input_text, value=900000)",
                "type": "BadRequestError",
                "param": "input_text",
                "code": 400,
            }
        },
        {"dialect": "vllm", "limit_tokens": 32768, "prompt_tokens": None, "output_tokens": 1024},
    ),
    # vLLM renderer, later wording ("your prompt contains at least"), as returned through Bedrock
    # and litellm by DeepSeek V3.2 and by self-hosted vLLM.
    (
        "vllm_total_at_least",
        400,
        {
            "error": {
                "message": "This model's maximum context length is 32768 tokens. However, you requested 8192 "
                "output tokens and your prompt contains at least 24577 input tokens, for a total of at "
                "least 32769 tokens. Please reduce the length of the input prompt or the number of "
                "requested output tokens. (parameter=input_tokens, value=24577)",
                "type": "BadRequestError",
                "param": "input_tokens",
                "code": 400,
            }
        },
        {
            "dialect": "vllm",
            "limit_tokens": 32768,
            "prompt_tokens": 24577,
            "output_tokens": 8192,
            "prompt_at_least": True,
        },
    ),
    (
        "vllm_total_exact",
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, you requested 64 "
                "output tokens and your prompt contains 10000 input tokens, for a total of 10064 tokens. "
                "Please reduce the length of the input prompt or the number of requested output tokens.",
                "type": "BadRequestError",
                "code": 400,
            }
        },
        {"dialect": "vllm", "limit_tokens": 8192, "prompt_tokens": 10000, "prompt_at_least": False},
    ),
    # vLLM serving_engine._validate_input (vllm-project/vllm), prompt alone over the window.
    (
        "vllm_request_has",
        400,
        b'{"error":{"message":"This model\'s maximum context length is 2048 tokens. However, your '
        b"request has 4176 input tokens. Please reduce the length of the input messages. "
        b'(parameter=input_tokens, value=4176)","type":"BadRequestError","param":"input_tokens","code":400}}',
        {"dialect": "vllm", "limit_tokens": 2048, "prompt_tokens": 4176, "output_tokens": None},
    ),
    # vLLM serving_engine._validate_input: prompt fits, prompt + max_tokens does not.
    (
        "vllm_max_tokens_plus_prompt",
        400,
        {
            "error": {
                "message": "'max_tokens' or 'max_completion_tokens' is too large: 16384. This model's "
                "maximum context length is 65536 tokens and your request has 52189 input tokens "
                "(16384 > 65536 - 52189). (parameter=max_tokens, value=16384)",
                "type": "BadRequestError",
                "param": "max_tokens",
                "code": 400,
            }
        },
        {"dialect": "vllm", "limit_tokens": 65536, "prompt_tokens": 52189, "output_tokens": 16384},
    ),
    # vLLM v1 engine input processor (vllm/v1/engine/processor.py), as captured by users.
    (
        "vllm_decoder_prompt",
        400,
        {
            "error": {
                "message": "The decoder prompt (length 12324) is longer than the maximum model length of "
                "8192. Make sure that `max_model_len` is no smaller than the number of text tokens.",
                "type": "BadRequestError",
                "code": 400,
            }
        },
        {"dialect": "vllm", "limit_tokens": 8192, "prompt_tokens": 12324},
    ),
    # Anthropic Messages API (docs: errors), also Bedrock/Vertex Claude.
    (
        "anthropic_prompt_too_long",
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208310 tokens > 200000 maximum",
            },
        },
        {"dialect": "anthropic", "limit_tokens": 200000, "prompt_tokens": 208310, "output_tokens": None},
    ),
    (
        "anthropic_input_plus_max_tokens",
        400,
        b'{"type":"error","error":{"type":"invalid_request_error","message":"input length and '
        b"`max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or "
        b'`max_tokens` and try again"}}',
        {
            "dialect": "anthropic",
            "limit_tokens": 200000,
            "prompt_tokens": 188240,
            "output_tokens": 21333,
            "requested_tokens": 209573,
        },
    ),
    # llama.cpp server: server_task_result_error::to_json adds n_prompt_tokens/n_ctx for
    # ERROR_TYPE_EXCEED_CONTEXT_SIZE; format_error_response gives code 400 and the type string.
    (
        "llamacpp_structured",
        400,
        b'{"error":{"code":400,"message":"request (13392 tokens) exceeds the available context size '
        b'(8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":13392,'
        b'"n_ctx":8192}}',
        {"dialect": "llamacpp", "limit_tokens": 8192, "prompt_tokens": 13392},
    ),
    # Older llama.cpp: no numbers in the message, the fields carry them.
    (
        "llamacpp_old_message",
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 4267,
                "n_ctx": 4096,
            }
        },
        {"dialect": "llamacpp", "limit_tokens": 4096, "prompt_tokens": 4267},
    ),
    # Even a 5xx is an overflow when the structure says so.
    (
        "llamacpp_type_on_500",
        500,
        {"error": {"code": 500, "message": "whatever", "type": "exceed_context_size_error", "n_ctx": 2048}},
        {"dialect": "llamacpp", "limit_tokens": 2048, "prompt_tokens": None},
    ),
    # llama.cpp streamed error chunk.
    (
        "llamacpp_stream_chunk",
        200,
        'error: {"code":400,"message":"the request exceeds the available context size. try increasing the '
        'context size or enable context shift","type":"invalid_request_error"}',
        {"dialect": "llamacpp", "limit_tokens": None},
    ),
    # SGLang (and gateways in front of it): top-level {"object":"error",...}; float counts occur.
    (
        "sglang_total",
        400,
        {
            "object": "error",
            "message": "Requested token count exceeds the model's maximum context length of 262144 tokens. "
            "You requested a total of 263925 tokens: 199925 tokens from the input messages and 64000 "
            "tokens for the completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        {
            "dialect": "sglang",
            "limit_tokens": 262144,
            "prompt_tokens": 199925,
            "output_tokens": 64000,
            "requested_tokens": 263925,
        },
    ),
    (
        "sglang_total_floats",
        400,
        {
            "message": "Bad request!: Requested token count exceeds the model's maximum context length of "
            "131072 tokens. You requested a total of 524300.0 tokens: 12 tokens from the input messages "
            "and 524288.0 tokens for the completion.",
            "error_code": 400,
        },
        {"dialect": "sglang", "limit_tokens": 131072, "prompt_tokens": 12, "output_tokens": 524288},
    ),
    (
        "sglang_input_longer",
        400,
        '{"object":"error","message":"The input (400013 tokens) is longer than the model\'s context '
        'length (262144 tokens).","type":"BadRequestError","param":null,"code":400}',
        {"dialect": "sglang", "limit_tokens": 262144, "prompt_tokens": 400013},
    ),
    # Hugging Face TGI router validation, 422 with a string "error" and error_type "validation".
    (
        "tgi_sum",
        422,
        b'{"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: '
        b'4000 `inputs` tokens and 200 `max_new_tokens`","error_type":"validation"}',
        {"dialect": "tgi", "limit_tokens": 4096, "prompt_tokens": 4000, "output_tokens": 200},
    ),
    (
        "tgi_inputs_only",
        422,
        {
            "error": "Input validation error: `inputs` must have less than 4096 tokens. Given: 5000",
            "error_type": "validation",
        },
        {"dialect": "tgi", "limit_tokens": 4096, "prompt_tokens": 5000, "output_tokens": 0},
    ),
    # LM Studio.
    (
        "lmstudio",
        400,
        '{"error":"Trying to keep the first 6269 tokens when context the overflows. However, the model is '
        "loaded with context length of only 4096 tokens, which is not enough. Try to load the model with a "
        'larger context length, or provide a shorter input"}',
        {"dialect": "lmstudio", "limit_tokens": 4096, "prompt_tokens": 6269},
    ),
    # xAI: the limit is on the prompt alone.
    (
        "xai",
        400,
        {
            "code": "Client specified an invalid argument",
            "error": "This model's maximum prompt length is 131072 but the request contains 537812 tokens.",
        },
        {"dialect": "xai", "limit_tokens": 131072, "prompt_tokens": 537812, "output_tokens": 0},
    ),
    # Groq / Cerebras: the sentence alone, under OpenAI's code on Groq.
    (
        "groq",
        400,
        {
            "error": {
                "message": "Please reduce the length of the messages or completion.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        {"dialect": "openai", "limit_tokens": None},
    ),
    (
        "cerebras_sentence_only",
        400,
        {"message": "Please reduce the length of the messages or completion", "status": 400},
        {"dialect": "groq", "limit_tokens": None},
    ),
    # Mistral.
    (
        "mistral",
        400,
        {
            "object": "error",
            "message": "Prompt contains 40101 tokens and 0 draft tokens, too large for model with 32768 "
            "maximum context length",
            "type": "invalid_request_message_error",
            "param": None,
            "code": None,
        },
        {"dialect": "mistral", "limit_tokens": 32768, "prompt_tokens": 40101},
    ),
    # Amazon Bedrock ValidationException (repost.aws: bedrock validation exception errors).
    (
        "bedrock_input_too_long",
        400,
        b'{"message":"Input is too long for requested model."}',
        {"dialect": "bedrock", "limit_tokens": None},
    ),
    (
        "bedrock_claude_prompt_too_long",
        400,
        {"message": "prompt is too long: 215000 tokens > 200000 maximum"},
        {"dialect": "anthropic", "limit_tokens": 200000, "prompt_tokens": 215000},
    ),
    # OpenRouter's own pre-flight check, with its breakdown.
    (
        "openrouter_preflight",
        400,
        {
            "error": {
                "message": "This endpoint's maximum context length is 163840 tokens. However, you requested "
                "about 221324 tokens (220500 of text input, 824 of tool input). Please reduce the length of "
                'either one, or use the "middle-out" transform to compress your prompt automatically.',
                "code": 400,
                "metadata": {"provider_name": None},
            }
        },
        {
            "dialect": "openrouter",
            "limit_tokens": 163840,
            "prompt_tokens": 221324,
            "output_tokens": None,
            "requested_tokens": 221324,
        },
    ),
    (
        "openrouter_preflight_with_output",
        400,
        {
            "error": {
                "message": "This endpoint's maximum context length is 200000 tokens. However, you requested "
                "about 201209 tokens (158536 of text input, 10673 of tool input, 32000 in the output). "
                'Please reduce the length of either one, or use the "middle-out" transform to compress your '
                "prompt automatically.",
                "code": 400,
            }
        },
        {"dialect": "openrouter", "limit_tokens": 200000, "prompt_tokens": 169209, "output_tokens": 32000},
    ),
    # OpenRouter passing a provider's own body through error.metadata.raw.
    (
        "openrouter_wrapped_anthropic",
        400,
        {
            "error": {
                "message": "Provider returned error",
                "code": 400,
                "metadata": {
                    "raw": '{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too '
                    'long: 210432 tokens > 200000 maximum"}}',
                    "provider_name": "Anthropic",
                },
            }
        },
        {"dialect": "anthropic", "limit_tokens": 200000, "prompt_tokens": 210432},
    ),
    # Gemini OpenAI-compatible endpoint (a list body, as Google APIs send), input limit.
    (
        "gemini_list_body",
        400,
        '[{"error":{"code":400,"message":"The input token count (1196265) exceeds the maximum number of '
        'tokens allowed (1048575).","status":"INVALID_ARGUMENT"}}]',
        {"dialect": "google", "limit_tokens": 1048575, "prompt_tokens": 1196265, "output_tokens": 0},
    ),
    # Moonshot / Kimi.
    (
        "moonshot",
        400,
        {
            "error": {
                "type": "invalid_request_error",
                "message": "Invalid request: Your request exceeded model token limit: 262144 "
                "(requested: 300000)",
            }
        },
        {"dialect": "moonshot", "limit_tokens": 262144, "requested_tokens": 300000, "prompt_tokens": None},
    ),
    # Ollama's OpenAI-compatible endpoint.
    (
        "ollama",
        400,
        {
            "error": {
                "message": "prompt too long; exceeded max context length by 100918 tokens",
                "type": "api_error",
            }
        },
        {"dialect": "ollama", "limit_tokens": None},
    ),
    # A gateway (litellm) that re-wraps an upstream body into its own message string.
    (
        "litellm_wrapped_vllm",
        400,
        {
            "error": {
                "message": 'litellm.BadRequestError: OpenAIException - {"error":{"message":"You passed 98305 '
                "input tokens and requested 32768 output tokens. However, the model's context length is only "
                "131072 tokens, resulting in a maximum input length of 98304 tokens. Please reduce the "
                'length of the input prompt. (parameter=input_tokens, value=98305)","type":"BadRequestError",'
                '"param":"input_tokens","code":400}}. Received Model Group=nvidia/nemotron',
                "type": None,
                "param": None,
                "code": "400",
            }
        },
        {"dialect": "vllm", "limit_tokens": 131072, "prompt_tokens": 98305, "output_tokens": 32768},
    ),
    # A plain-text body (some gateways answer text/plain).
    (
        "plain_text",
        400,
        "prompt is too long: 210000 tokens > 200000 maximum",
        {"dialect": "anthropic", "limit_tokens": 200000, "prompt_tokens": 210000},
    ),
    # Comma-grouped numbers.
    (
        "grouped_numbers",
        400,
        {"error": {"message": "prompt is too long: 1,210,000 tokens > 1,000,000 maximum"}},
        {"dialect": "anthropic", "limit_tokens": 1000000, "prompt_tokens": 1210000},
    ),
]

NOT_OVERFLOW_CASES: list[Case] = [
    # OpenAI TPM rate limit: 429, mentions tokens and a limit (openai rate-limit docs / API users).
    (
        "openai_tpm_429",
        429,
        {
            "error": {
                "message": "Request too large for gpt-4o in organization org-abc on tokens per min (TPM): "
                "Limit 30000, Requested 50000. The input or output tokens must be reduced in order to run "
                "successfully. Visit https://platform.openai.com/account/rate-limits to learn more.",
                "type": "tokens",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        },
        None,
    ),
    # The same TPM wording delivered with a 400 or 413 by a gateway must still not count.
    (
        "openai_tpm_on_400",
        400,
        {
            "error": {
                "message": "Rate limit reached for gpt-4o-mini in organization org-x on tokens per min "
                "(TPM): Limit 200000, Used 195869, Requested 4412. Please try again in 84ms.",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            }
        },
        None,
    ),
    (
        "groq_tpm_413",
        413,
        {
            "error": {
                "message": "Request too large for model `llama-3.3-70b-versatile` in organization `org_x` "
                "service tier `on_demand` on tokens per minute (TPM): Limit 12000, Requested 19034, please "
                "reduce your message size and try again.",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            }
        },
        None,
    ),
    # A 429 even with overflow wording in it.
    (
        "overflow_wording_on_429",
        429,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens.",
                "code": "context_length_exceeded",
            }
        },
        None,
    ),
    # Bedrock throttling is a 400 that says "Too many tokens".
    (
        "bedrock_throttling",
        400,
        {"message": "Too many tokens, please wait before trying again."},
        None,
    ),
    # 413 payload too large (HTML from a reverse proxy, and Anthropic's byte-size limit).
    (
        "nginx_413_html",
        413,
        b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 "
        b"Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
        None,
    ),
    (
        "anthropic_413_request_too_large",
        413,
        {
            "type": "error",
            "error": {"type": "request_too_large", "message": "Request exceeds the maximum size"},
        },
        None,
    ),
    # max_tokens too large for the model's OUTPUT (OpenAI), not a context overflow.
    (
        "openai_max_tokens_too_large",
        400,
        {
            "error": {
                "message": "max_tokens is too large: 100000. This model supports at most 16384 completion "
                "tokens, whereas you provided 100000.",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "invalid_value",
            }
        },
        None,
    ),
    (
        "max_tokens_lte",
        400,
        {
            "error": {
                "message": "max_tokens must be less than or equal to `8192`",
                "type": "invalid_request_error",
            }
        },
        None,
    ),
    (
        "anthropic_max_tokens_output_cap",
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "max_tokens: 100000 > 64000, which is the maximum allowed number of output tokens "
                "for claude-sonnet-4-20250514",
            },
        },
        None,
    ),
    # vLLM: max_tokens alone larger than the window (TokenizeParams.__post_init__).
    (
        "vllm_max_output_over_window",
        400,
        {
            "error": {
                "message": "max_completion_tokens=131072cannot be greater than "
                "max_model_len=max_total_tokens=65536. "
                "Please request fewer output tokens.",
                "type": "BadRequestError",
                "code": 400,
            }
        },
        None,
    ),
    # Authentication.
    (
        "invalid_api_key",
        401,
        {
            "error": {
                "message": "Incorrect API key provided: sk-abc. You can find your API key at "
                "https://platform.openai.com/account/api-keys.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
        None,
    ),
    (
        "invalid_api_key_on_400",
        400,
        {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}},
        None,
    ),
    # Generic 5xx, including one whose text would match: text alone never counts on a 5xx.
    (
        "openai_500",
        500,
        {
            "error": {
                "message": "The server had an error processing your request. Sorry about that!",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        },
        None,
    ),
    (
        "overflow_text_on_503",
        503,
        "litellm.ServiceUnavailableError: OpenAIException - Requested token count exceeds the model's "
        "maximum context length of 131072 tokens.",
        None,
    ),
    (
        "overflow_text_in_json_on_502",
        502,
        {"error": {"message": "prompt is too long: 210000 tokens > 200000 maximum"}},
        None,
    ),
    (
        "cloudflare_502_html",
        502,
        "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>Bad gateway</body></html>",
        None,
    ),
    # Other ordinary 400s.
    (
        "invalid_temperature",
        400,
        {
            "error": {
                "message": "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, "
                "but got 200 instead.",
                "type": "invalid_request_error",
                "param": "temperature",
                "code": "decimal_above_max_value",
            }
        },
        None,
    ),
    (
        "tool_message_order",
        400,
        {
            "error": {
                "message": "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                "message with 'tool_calls'.",
                "type": "invalid_request_error",
                "param": "messages.[2].role",
                "code": None,
            }
        },
        None,
    ),
    # OpenRouter wrapping something that is not an overflow.
    (
        "openrouter_wrapped_rate_limit",
        429,
        {"error": {"message": "Provider returned error", "code": 429, "metadata": {"raw": "rate limited"}}},
        None,
    ),
    (
        "openrouter_wrapped_other_400",
        400,
        {
            "error": {
                "message": "Provider returned error",
                "code": 400,
                "metadata": {"raw": '{"error":{"message":"Invalid tool schema"}}', "provider_name": "Groq"},
            }
        },
        None,
    ),
    # The overflow wording where an unrelated field echoes it is not the error's message.
    (
        "echoed_in_unknown_field",
        400,
        {
            "error": {
                "message": "Invalid value for 'stop'",
                "input": "prompt is too long: 5 tokens > 3 maximum",
            }
        },
        None,
    ),
]
