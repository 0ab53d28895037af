// The AI SDK's own client (`ai` 6: DefaultChatTransport, the parser useChat reads with, and
// readUIMessageStream) against a running crossmem web function. Started by
// tests/functions/test_ai_sdk_client.py, which sets CROSSMEM_API, CROSSMEM_TOKEN and
// CROSSMEM_OVER_BUDGET_TOKEN (a person past their day's tokens).
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { test } from "node:test";
import { AbstractChat, readUIMessageStream } from "ai";
import { crossmemTransport, listConversations, loadMessages, newConversation } from "./crossmem-chat.mjs";

const api = process.env.CROSSMEM_API;
// A browser's navigator, which Node 20 has not: a Spanish speaker's.
if (globalThis.navigator?.language === undefined) {
  Object.defineProperty(globalThis, "navigator", { value: { language: "es-ES" }, configurable: true });
}

// What the transport's fetch was answered: status, the stream's header, and the raw bytes the
// SDK's parser read (passed through unchanged).
function recordingFetch() {
  const seen = [];
  const recording = async (url, init) => {
    const response = await fetch(url, init);
    const header = response.headers.get("x-vercel-ai-ui-message-stream");
    const answer = { status: response.status, header, raw: "", sent: init?.body };
    seen.push(answer);
    if (!response.body) return response;
    const decoder = new TextDecoder();
    const body = response.body.pipeThrough(new TransformStream({
      transform(chunk, controller) { answer.raw += decoder.decode(chunk, { stream: true }); controller.enqueue(chunk); },
    }));
    return new Response(body, { status: response.status, headers: response.headers });
  };
  return { seen, fetch: recording };
}

function userMessage(id, text) {
  return { id, role: "user", parts: [{ type: "text", text }] };
}

async function send(transport, chatId, messages, abortSignal) {
  return transport.sendMessages({ chatId, messages, trigger: "submit-message", messageId: undefined, abortSignal });
}

// Every chunk, in order, and the message the SDK assembles from them (and the errors it reports).
async function assemble(stream) {
  const [forChunks, forMessage] = stream.tee();
  const chunks = [];
  const reading = (async () => { for await (const chunk of forChunks) chunks.push(chunk); })();
  const errors = [];
  let message;
  for await (const snapshot of readUIMessageStream({ stream: forMessage, onError: (error) => errors.push(error) })) {
    message = snapshot;
  }
  await reading;
  return { chunks, message, errors };
}

const textOf = (message) => message.parts.filter((part) => part.type === "text").map((part) => part.text).join("");

test("a turn's text, assembled by the SDK, is the stored reply", async () => {
  const token = process.env.CROSSMEM_TOKEN;
  const recorder = recordingFetch();
  const transport = crossmemTransport({ api, accessToken: async () => token, fetch: recorder.fetch });
  const chat = await newConversation(api, async () => token, "the SDK's chat");
  const { chunks, message, errors } = await assemble(await send(transport, chat.id, [userMessage("u-1", "Tell me a story")]));

  assert.deepEqual(errors, []);
  const [answer] = recorder.seen;
  assert.equal(answer.status, 200);
  assert.equal(answer.header, "v1");
  assert.ok(answer.raw.endsWith("data: [DONE]\n\n"), "the stream ends with [DONE]");
  const kinds = chunks.map((chunk) => chunk.type);
  const deltas = kinds.filter((kind) => kind === "text-delta").length;
  assert.ok(deltas > 1);
  assert.deepEqual(kinds, ["start", "text-start", ...Array(deltas).fill("text-delta"), "text-end", "data-turn", "finish"]);

  const stored = await loadMessages(api, async () => token, chat.id);
  assert.deepEqual(stored.map((m) => m.role), ["user", "assistant"]);
  assert.equal(textOf(message), textOf(stored[1]));
  // A live turn: the SDK keeps the message under the id the reply was stored with, named by
  // `start` before the first word, as the history route gives it.
  assert.equal(message.id, stored[1].id);
  assert.deepEqual(chunks[0], { type: "start", messageId: stored[1].id });
  const turn = message.parts.find((part) => part.type === "data-turn").data;
  assert.deepEqual(turn, { conversationId: chat.id, messageId: turn.messageId, replyId: Number(stored[1].id), outcome: "answered" });
  assert.ok(Number.isInteger(turn.messageId));
  assert.equal(stored[0].id, "u-1"); // the person's message loads under the id it was sent with
  assert.ok((await listConversations(api, async () => token)).some((c) => c.id === chat.id));

  // The next turn sends the thread back as the SDK keeps it: the reply under the stored id.
  const thread = [...stored, userMessage("u-2", "And then?")];
  const next = await assemble(await send(transport, chat.id, thread));
  const reply = (await loadMessages(api, async () => token, chat.id))[3];
  assert.equal(textOf(next.message), textOf(reply));
  assert.equal(next.message.id, reply.id);
});

test("a turn whose model fails yields the SDK's error with our code", async () => {
  const token = process.env.CROSSMEM_TOKEN;
  const transport = crossmemTransport({ api, accessToken: async () => token });
  const chat = await newConversation(api, async () => token);
  const { chunks, errors } = await assemble(await send(transport, chat.id, [userMessage("u-fail", "please say nothing")]));
  assert.equal(errors.length, 1);
  assert.match(errors[0].message, /^model_unavailable: /);
  assert.deepEqual(chunks.slice(-2).map((chunk) => chunk.type), ["error", "finish"]);
});

// Anthropic's string for testing refusals: the fake model declines while it is in the messages.
const REFUSAL_TRIGGER = "ANTHROPIC_MAGIC_STRING_TRIGGER_REFUSAL_1FAEFB6177B4672DEE07F9D3AFC62588CCD2631EDCF22E8CCC1FB35B501C9C86";

test("a declined turn's mark is kept by the SDK and left out of the next turn", async () => {
  const token = process.env.CROSSMEM_TOKEN;
  const transport = crossmemTransport({ api, accessToken: async () => token });
  const chat = await newConversation(api, async () => token);
  const asked = userMessage("u-declined", `explain ${REFUSAL_TRIGGER}`);
  const { chunks, message, errors } = await assemble(await send(transport, chat.id, [asked]));
  assert.deepEqual(errors, []);
  assert.deepEqual(chunks.at(-1), { type: "finish", finishReason: "content-filter", messageMetadata: { declined: true } });
  assert.deepEqual(message.metadata, { declined: true });
  const stored = await loadMessages(api, async () => token, chat.id);
  assert.deepEqual(stored.map((m) => m.metadata.declined), [true, true]);
  // The thread as the SDK keeps it goes back with the mark: the turn is left out, and answered.
  const next = await assemble(await send(transport, chat.id, [asked, message, userMessage("u-after", "A story?")]));
  assert.deepEqual(next.errors, []);
  assert.equal(next.chunks.at(-1).finishReason, "stop");
});

test("a resume after an abort yields the reply once", async () => {
  const token = process.env.CROSSMEM_TOKEN;
  const transport = crossmemTransport({ api, accessToken: async () => token });
  const chat = await newConversation(api, async () => token);
  assert.equal(await transport.reconnectToStream({ chatId: chat.id }), null); // 204: nothing to resume

  const aborting = new AbortController();
  const stream = await send(transport, chat.id, [userMessage("u-abort", "Tell me a long story")], aborting.signal);
  const reader = stream.getReader();
  let cutOff; // the id the cut-off stream's start named
  for (let chunk = await reader.read(); chunk.value.type !== "text-delta"; chunk = await reader.read()) {
    if (chunk.value.type === "start") cutOff = chunk.value.messageId;
  }
  aborting.abort(); // the tab is closed after the first words
  await reader.cancel().catch(() => {});

  const resumed = await transport.reconnectToStream({ chatId: chat.id });
  assert.notEqual(resumed, null);
  const { message, errors } = await assemble(resumed);
  assert.deepEqual(errors, []);
  const stored = await loadMessages(api, async () => token, chat.id);
  assert.deepEqual(stored.map((m) => m.role), ["user", "assistant"]);
  assert.equal(textOf(message), textOf(stored[1]));
  // Answered anew (its first attempt ended with the abort): the message is the stored reply, under
  // the id the cut-off stream named.
  assert.equal(message.id, stored[1].id);
  assert.equal(message.id, cutOff);
  assert.equal(message.parts.find((part) => part.type === "data-turn").data.replyId, Number(stored[1].id));
  assert.equal(await transport.reconnectToStream({ chatId: chat.id }), null); // once
});

test("an over-budget turn answers 429 before any stream", async () => {
  const token = process.env.CROSSMEM_OVER_BUDGET_TOKEN;
  const recorder = recordingFetch();
  const transport = crossmemTransport({ api, accessToken: async () => token, fetch: recorder.fetch });
  const chat = await newConversation(api, async () => token);
  await assert.rejects(send(transport, chat.id, [userMessage("u-over", "one more")]), (error) => {
    assert.equal(JSON.parse(error.message).error, "over_budget");
    return true;
  });
  assert.deepEqual(recorder.seen.map((answer) => [answer.status, answer.header]), [[429, null]]);
});

test("a thread's earlier photos stay on the page: a turn sends only its own", async () => {
  const token = process.env.CROSSMEM_TOKEN;
  const recorder = recordingFetch();
  const transport = crossmemTransport({ api, accessToken: async () => token, fetch: recorder.fetch });
  const chat = await newConversation(api, async () => token);
  // The corpus's receipt grown to a 1568-pixel photo's size (bytes past its end, which a reader
  // leaves): two of them, sent again, pass the body's 1,000,000 bytes.
  const receipt = await readFile(new URL("../corpus/media/receipt.jpg", import.meta.url));
  const photo = Buffer.concat([receipt, randomBytes(400_000)]).toString("base64");
  const withPhoto = (id, text) => ({
    id,
    role: "user",
    parts: [{ type: "file", mediaType: "image/jpeg", url: `data:image/jpeg;base64,${photo}` }, { type: "text", text }],
  });
  const thread = [];
  for (const [id, text] of [["p-1", "my receipt"], ["p-2", "and this one"]]) {
    thread.push(withPhoto(id, text));
    const { message, errors } = await assemble(await send(transport, chat.id, thread));
    assert.deepEqual(errors, []);
    thread.push(message);
  }
  assert.deepEqual(recorder.seen.map((answer) => answer.status), [200, 200]);
  // Each new message goes alone: its own photo, none of the thread's.
  const files = (answer) => JSON.parse(answer.sent).message.parts.filter((p) => p.type === "file").length;
  assert.deepEqual(recorder.seen.map(files), [1, 1]);
  assert.equal(JSON.parse(recorder.seen[1].sent).timezone, Intl.DateTimeFormat().resolvedOptions().timeZone);
  // The browser's language too: the fixed answers' (a fallback, a pause), kept for the person's other apps.
  assert.equal(JSON.parse(recorder.seen[1].sent).language, navigator.language);
});

// useChat's state, as @ai-sdk/react's Chat keeps it (plain arrays: no framework here).
class ChatState {
  status = "ready";
  error = undefined;
  messages = [];
  pushMessage = (message) => { this.messages = [...this.messages, message]; };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (index, message) => { this.messages = this.messages.map((m, i) => (i === index ? message : m)); };
  snapshot = (thing) => structuredClone(thing);
}

test("a long chat, past the body's 1,000,000 bytes, is still answered: a new message alone, an edit what fits", async () => {
  // Seen failing: useChat posts its whole thread each turn; once a long chat's words passed the
  // body's limit, every next turn was a 413 and the chat was over.
  const token = process.env.CROSSMEM_TOKEN;
  const recorder = recordingFetch();
  const transport = crossmemTransport({ api, accessToken: async () => token, fetch: recorder.fetch });
  const conversation = await newConversation(api, async () => token);
  const long = (i) => ({ id: `long-${i}`, role: i % 2 ? "assistant" : "user", parts: [{ type: "text", text: `${i} `.repeat(12_000) }] });
  const state = Object.assign(new ChatState(), { messages: Array.from({ length: 40 }, (_, i) => long(i)) });
  assert.ok(JSON.stringify(state.messages).length > 1_000_000);
  const chat = new AbstractChat({ id: conversation.id, transport, state });
  await chat.sendMessage({ text: "and now?" });
  assert.equal(chat.status, "ready");
  assert.deepEqual(recorder.seen.map((answer) => answer.status), [200]);
  const sent = JSON.parse(recorder.seen[0].sent);
  assert.deepEqual(Object.keys(sent).sort(), ["id", "language", "message", "timezone", "trigger"]);
  assert.deepEqual([sent.id, sent.trigger, textOf(sent.message)], [conversation.id, "submit-message", "and now?"]);
  const stored = await loadMessages(api, async () => token, conversation.id);
  assert.deepEqual(stored.map((m) => [m.role, m.role === "user" ? textOf(m) : "reply"]), [["user", "and now?"], ["assistant", "reply"]]);
  assert.equal(textOf(chat.messages.at(-1)), textOf(stored[1]));

  // An edit, then a Try again, send the page's thread: its newest messages' words, as many as fit.
  await chat.sendMessage({ text: "and then?", messageId: chat.messages.at(-2).id });
  await chat.regenerate();
  assert.equal(chat.status, "ready");
  assert.deepEqual(recorder.seen.map((answer) => answer.status), [200, 200, 200]);
  for (const answer of recorder.seen.slice(1)) {
    assert.ok(new TextEncoder().encode(answer.sent).length < 1_000_000);
    const thread = JSON.parse(answer.sent).messages;
    assert.equal(textOf(thread.at(-1)), "and then?");
    assert.deepEqual(thread.slice(0, -1).map((m) => m.id), state.messages.slice(40 - (thread.length - 1), 40).map((m) => m.id));
    assert.ok(thread.length > 10 && thread.length < 40, `${thread.length} messages`);
  }
});

// A fetch whose first answer's connection drops after the reply's first words, as a phone's does
// when the page goes to the background: the browser's fetch then fails with a TypeError.
function droppingFetch() {
  let dropped = false;
  return async (url, init) => {
    if (dropped || init?.method !== "POST") return fetch(url, init);
    dropped = true;
    const hangUp = new AbortController();
    const response = await fetch(url, { ...init, signal: hangUp.signal });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let words = false; // the reply's first words were passed on: the next read fails
    const body = new ReadableStream({
      async pull(controller) {
        if (words) {
          hangUp.abort();
          return controller.error(new TypeError("network error"));
        }
        const { value, done } = await reader.read();
        if (done) return controller.close();
        controller.enqueue(value);
        words = decoder.decode(value).includes('"text-delta"');
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
}

test("a reconnect after a dropped connection shows the reply once", async () => {
  // useChat({ resume: true }) reconnects when the page is visible again after a network
  // disconnect (the AI SDK's "Chatbot Resume Streams"): the chat ends with one reply, not the
  // cut-off words beside the reply that the resume brought.
  const token = process.env.CROSSMEM_TOKEN;
  const transport = crossmemTransport({ api, accessToken: async () => token, fetch: droppingFetch() });
  const conversation = await newConversation(api, async () => token);
  const chat = new AbstractChat({ id: conversation.id, transport, state: new ChatState() });
  await chat.sendMessage({ text: "Tell me a long story" });
  assert.equal(chat.status, "error"); // the dropped connection
  await chat["~resumeStreamIfDisconnected"]();
  assert.equal(chat.status, "ready");
  const stored = await loadMessages(api, async () => token, conversation.id);
  assert.deepEqual(stored.map((m) => m.role), ["user", "assistant"]);
  assert.deepEqual(chat.messages.map((m) => [m.role, m.role === "user" ? m.id : textOf(m)]), [
    ["user", stored[0].id],
    ["assistant", textOf(stored[1])],
  ]);
  assert.equal(chat.messages[1].id, stored[1].id);
});

test("a reloaded page lists the thread useChat shows after an edit, an edit back and a Try again", async () => {
  // useChat's edit (sendMessage({ text, messageId })) and its Try again of an earlier reply
  // (regenerate({ messageId })) drop what followed from the page; the history route, loaded
  // again, gives the page the thread it showed, and the next turn reads that thread.
  const token = process.env.CROSSMEM_TOKEN;
  const transport = crossmemTransport({ api, accessToken: async () => token });
  const conversation = await newConversation(api, async () => token);
  const shown = (messages) => messages.map((m) => [m.role, m.role === "user" ? textOf(m) : "reply"]);
  const reloaded = async () => shown(await loadMessages(api, async () => token, conversation.id));
  const chat = new AbstractChat({ id: conversation.id, transport, state: new ChatState() });
  for (const text of ["dentist on monday", "buy milk"]) await chat.sendMessage({ text });
  const first = chat.messages[0].id;
  await chat.sendMessage({ text: "dentist on tuesday", messageId: first });
  await chat.sendMessage({ text: "and bread" });
  await chat.sendMessage({ text: "dentist on monday", messageId: first });
  assert.equal(chat.status, "ready");
  assert.deepEqual(shown(chat.messages), [["user", "dentist on monday"], ["assistant", "reply"]]);
  assert.deepEqual(await reloaded(), shown(chat.messages));

  await chat.sendMessage({ text: "call mum" });
  const page = new AbstractChat({
    id: conversation.id,
    transport,
    state: Object.assign(new ChatState(), { messages: await loadMessages(api, async () => token, conversation.id) }),
  });
  await page.regenerate({ messageId: page.messages[1].id });
  assert.equal(page.status, "ready");
  assert.deepEqual(shown(page.messages), [["user", "dentist on monday"], ["assistant", "reply"]]);
  assert.deepEqual(await reloaded(), shown(page.messages));
});
