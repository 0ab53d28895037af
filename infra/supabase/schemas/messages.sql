-- Messages: every message of every surface, one row each, in the order (created_at, id).
--
-- user_id is denormalised from the conversation for the hot index and for row-level security.
-- A user message carries `answer_by`: until then its attempt may still answer (the surface's
-- model deadline plus a margin); after it, or once its attempt is known to have ended
-- (end_attempt), a message with no reply is owed (owed_replies.sql). `sender` keeps the chat
-- or number it came from, so the scheduled job knows where to answer.

create table public.messages (
    id bigint generated always as identity primary key,
    conversation_id uuid not null references public.conversations (id) on delete cascade,
    user_id uuid not null,
    surface text not null check (surface in ('web', 'telegram', 'whatsapp')),
    role text not null check (role in ('user', 'assistant')),
    content text not null check (char_length(content) between 1 and 200000),
    -- Telegram update_id, Twilio MessageSid, web client message id.
    external_id text,
    -- An assistant reply points at the user message it answers: one reply per message.
    in_reply_to bigint references public.messages (id) on delete cascade,
    -- When the reply reached the person; null while a surface still owes it.
    delivered_at timestamptz,
    created_at timestamptz not null default clock_timestamp(),
    -- The begin_turn call that stored it (a random token): the same call retried after its
    -- connection died recognises its own message and is not a redelivery.
    attempt uuid,
    answer_by timestamptz,
    sender text
);
alter table public.messages enable row level security;  -- who reads what: access.sql

-- The hot query: a person's recent messages across all conversations.
create index messages_by_user_recent
    on public.messages (user_id, created_at desc, id desc);
create index messages_by_conversation_recent
    on public.messages (conversation_id, created_at desc, id desc);
create unique index messages_one_reply
    on public.messages (in_reply_to) where in_reply_to is not null;
create unique index messages_once_per_attempt on public.messages (attempt) where attempt is not null;
-- A delivery's key is (person, surface, external_id). Telegram's update_id and Twilio's
-- MessageSid are unique for the whole bot, so per person is the same thing for them; the
-- web's client_message_id means something only to the person who chose it. The same rule is
-- the "already stored" answer and the budget's exemption: a key seen before never reaches
-- the model again, whatever conversation it names. Replies have no key: they are not in it.
create unique index messages_once_per_delivery on public.messages (user_id, surface, external_id)
    where external_id is not null;
-- The purge reads messages by age, in bounded batches.
create index messages_by_age on public.messages (created_at, id);
-- What the owed-replies job scans: unanswered user messages of the last minutes, by age.
create index messages_owed on public.messages (created_at) where role = 'user' and sender is not null;


-- One conversation's messages, newest page first when paging back with p_before_id;
-- each page is returned oldest first.
create or replace function public.conversation_messages(
    p_user_id uuid,
    p_conversation_id uuid,
    p_before_id bigint,
    p_limit integer
) returns jsonb language sql stable set search_path = '' as $$
    select case when c.id is null then jsonb_build_object('error', 'conversation_not_found')
           else jsonb_build_object(
               'conversation', jsonb_build_object('id', c.id, 'surface', c.surface, 'title', c.title,
                                                  'created_at', c.created_at, 'updated_at', c.updated_at),
               'messages', (
                   select coalesce(jsonb_agg(to_jsonb(p) order by p.created_at, p.id), '[]'::jsonb)
                     from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
                             from public.messages m
                            where m.conversation_id = c.id and m.user_id = p_user_id
                              and (p_before_id is null or m.id < p_before_id)
                            order by m.created_at desc, m.id desc
                            limit p_limit) p))
           end
      from (select 1) one
      left join public.conversations c on c.id = p_conversation_id and c.user_id = p_user_id;
$$;

-- A person's latest messages over every conversation, oldest first (the CLI's history).
create or replace function public.person_history(p_user_id uuid, p_limit integer)
    returns jsonb language sql stable set search_path = '' as $$
    select coalesce(jsonb_agg(to_jsonb(h) order by h.created_at, h.id), '[]'::jsonb)
      from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
              from public.messages m
             where m.user_id = p_user_id
             order by m.created_at desc, m.id desc
             limit p_limit) h;
$$;
