"""The front-door APIs besides Chat Completions: Anthropic Messages and OpenAI Responses.

Pure code, no IO and no clock: the routes and the relay call it (docs/architecture.md "Front-door APIs").
One module per concern:

=======================  =====================================================================
``messages_request``     ``messages_to_chat(payload) -> MessagesTurn`` (the Chat Completions
                         body, model, stream, stop sequences); ``tool_result_ids``
``messages_stream``      ``MessagesStream`` (chat SSE -> Anthropic SSE, ``feed`` / ``finish``);
                         ``completion_to_message`` for a whole answer
``responses_request``    ``responses_to_chat(payload) -> ResponsesTurn`` (body, model, stream,
                         namespace tool names, the parameters a Response repeats);
                         ``call_output_ids``
``responses_stream``     ``ResponsesStream`` (chat SSE -> Responses SSE); ``completion_to_response``
``_answer``              ``Assembler``: the answer's parts (text, reasoning, each tool call) from
                         the engine's deltas, each opened once and closed when whole; both
                         stream translators write its ops as their events
``facts``                ``MessagesScanner`` / ``ResponsesScanner``: the chat ``SSEScanner``'s
                         interface over natively served answers (compiled twins in
                         ``_speedups/_facts_c.pyx``, pure ones in ``_facts_py``);
                         ``message_facts`` / ``response_facts`` for whole ones
``errors``               ``TranslationError`` (400), ``error_body(api, status, message)``,
                         ``engine_refusal_body``: each API's error shape for the failure contract
``models``               ``models_body`` / ``model_body`` in the Anthropic or OpenAI shape
``sessions``             ``harness_session(header, payload)``: run identity from Claude Code's and
                         Codex's own session signals
=======================  =====================================================================

The routes that use them are ``luftpause.dataplane.intake.front_doors`` (what a request becomes) and the
relay (``Turn.translation``, ``Turn.native``). How they use them, for a turn its replica does not
serve natively::

    turn = messages_to_chat(payload)                     # TranslationError -> 400, API's shape
    body = orjson.dumps(turn.body)                       # sent to /v1/chat/completions
    stream = MessagesStream(turn.model, message_id, turn.stop_sequences)
    send(stream.start())                                 # at the engine's 200 (optional)
    for read in engine:  send(stream.feed(read))         # TranslationBroken -> abort
    send(stream.finish())                                # StreamIncomplete -> abort
    facts = stream.scanner                               # first token, usage, finish, error
    remember(stream.tool_call_ids)                       # the ids the client saw

and for one it does (bytes relayed unchanged): ``MessagesScanner().feed(read)`` in place of the chat
``SSEScanner``. Responses likewise, with ``ResponsesStream(response_id, turn.model, created_at,
turn.echo, turn.tool_names)``.
"""
