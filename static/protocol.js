// The values the chat page and the server exchange, named once: the session socket's frames (app/chat/ws.py),
// how a stored reply ended (app/db/models.py) and why generation finished (engine/core/sequence.py FinishReason).

/** Client → server frames. MESSAGE, REGENERATE, EDIT and CONTINUE each start a reply (the server's REPLY_FRAMES);
MESSAGE names the reply it follows (`parent_id`), the others their message (`message_id`); without one, the branch on
show. BRANCH switches the branch on show to the one through `message_id`. */
export const ClientFrame = Object.freeze({
  MESSAGE: "message",
  REGENERATE: "regenerate",
  EDIT: "edit",
  CONTINUE: "continue",
  BRANCH: "branch",
  STOP: "stop",
  PING: "ping",
});

/** Server → client frames, in the order a reply sends them: START, PROGRESS..., ASSISTANT_START, DELTA..., DONE. */
export const ServerFrame = Object.freeze({
  // the server accepted a reply frame; carries the stored user message
  START: "start",
  // until the first token: how far the prompt has been read ({total, cached, processed, queue_position})
  PROGRESS: "progress",
  ASSISTANT_START: "assistant_start",
  DELTA: "delta",
  DONE: "done",
  // the answer to BRANCH: the branch now on show
  BRANCH: "branch",
  // a refused frame or a failed reply; the socket stays open
  ERROR: "error",
  STOP_ACK: "stop_ack",
  PONG: "pong",
});

/** An assistant message's status: STREAMING until it ends as one of the other four. */
export const ReplyStatus = Object.freeze({
  STREAMING: "streaming",
  FINISHED: "finished",
  // the user pressed Stop
  STOPPED: "stopped",
  // the connection dropped (or the server restarted) mid-reply
  INTERRUPTED: "interrupted",
  FAILED: "failed",
});

/** Why the engine stopped generating a reply (a message's `finish_reason`). */
export const FinishReason = Object.freeze({
  // end of sequence, a stop token or a stop string
  STOP: "stop",
  // max_tokens or max_model_len
  LENGTH: "length",
  ABORT: "abort",
  ERROR: "error",
});

/** Socket close codes after which reconnecting cannot help. */
export const CloseCode = Object.freeze({
  POLICY_VIOLATION: 1008,
  // accounts: the socket's sign-in is missing or ended (the page goes to the sign-in page)
  NOT_SIGNED_IN: 4401,
  SESSION_NOT_FOUND: 4404,
});
