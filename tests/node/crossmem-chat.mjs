// useChat against the crossmem web function: the transport, and the routes a chat page needs
// beside it. docs/frontend.md shows this file as it is (a test compares them); chat.test.mjs runs
// it against a real server.
import { DefaultChatTransport } from "ai";

// `api`: the function's root, with its trailing slash: https://REGION-PROJECT.cloudfunctions.net/web_chat/
// deployed, http://127.0.0.1:8080/chat/ under `make dev`. `accessToken`: the Supabase session's
// access token, asked at every request (supabase-js renews it before it expires).
export function crossmemTransport({ api, accessToken, fetch }) {
  return new DefaultChatTransport({
    api, // POST `${api}` sends a turn; GET `${api}${chatId}/stream` resumes it
    headers: async () => ({ Authorization: `Bearer ${await accessToken()}` }),
    // The person's clock and language: their follow-ups' time, and the language of the fixed
    // answers (a fallback, a pause), both kept for their other apps.
    body: () => ({ timezone: Intl.DateTimeFormat().resolvedOptions().timeZone, language: navigator.language }),
    // useChat posts its whole thread each turn, which a long chat takes past the body's 1,000,000
    // bytes (413). The function stores the thread: a new message goes alone, `{ id, message }`.
    // An edit or a Try again sends the thread the page shows, that turn's history: the words (not
    // the photos and voice notes) of its newest messages, as many as fit.
    prepareSendMessagesRequest: ({ id, messages, body, trigger, messageId }) => {
      const last = messages.at(-1);
      if (trigger === "submit-message" && messageId === undefined) return { body: { ...body, id, trigger, message: last } };
      const earlier = [];
      let room = 900_000 - bytes(last); // the rest of the body fits in what is left
      for (const message of messages.slice(0, -1).reverse()) {
        const words = { ...message, parts: message.parts.filter((part) => part.type !== "file") };
        if ((room -= bytes(words)) < 0) break;
        earlier.unshift(words);
      }
      return { body: { ...body, id, trigger, messageId, messages: [...earlier, last] } };
    },
    fetch,
  });
}

const bytes = (value) => new TextEncoder().encode(JSON.stringify(value)).length;

async function call(api, accessToken, path, init = {}) {
  const response = await fetch(new URL(path, api), {
    ...init,
    headers: { Authorization: `Bearer ${await accessToken()}`, "Content-Type": "application/json" },
  });
  if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
  return response.status === 204 ? null : response.json();
}

// A chat's id is its conversation's: make one before the first message.
export async function newConversation(api, accessToken, title = "") {
  return call(api, accessToken, "conversations", { method: "POST", body: JSON.stringify({ title }) });
}

// The person's conversations, the latest active first: web ones and their [Telegram] / [WhatsApp]
// threads, every page of them.
export async function listConversations(api, accessToken) {
  let page = await call(api, accessToken, "conversations");
  const conversations = [...page.conversations];
  while (page.has_more) {
    page = await call(api, accessToken, `conversations?before=${encodeURIComponent(page.next)}`);
    conversations.push(...page.conversations);
  }
  return conversations;
}

// A conversation's stored messages as useChat's `messages`: ids and metadata kept, so the next
// turn's history names each stored message once. The person's web message keeps the id it was
// sent with (`client_id`): "Try again" (regenerate()) sends it again under it, stored once.
export async function loadMessages(api, accessToken, conversationId, limit = 50) {
  const page = await call(api, accessToken, `conversations/${conversationId}/messages?limit=${limit}`);
  return page.messages.map((message) => ({
    id: message.client_id ?? String(message.id),
    role: message.role,
    parts: [{ type: "text", text: message.content }],
    metadata: { surface: message.surface, createdAt: message.created_at, kind: message.kind, declined: message.declined },
  }));
}
