-- A turn: two round trips. begin_turn (before the model call) resolves the person and the
-- conversation, stores the user message once and returns the context window; finish_turn
-- (after it) stores the reply. end_attempt closes an attempt that stored no reply.

-- The parts of begin_turn, each replaceable on its own. All plpgsql: PL/pgSQL keeps each
-- statement's plan for the session, where a `language sql` function called on its own (not
-- inlined: a function with `set search_path` never is) is planned again at every call. They live in crossmem_private, which
-- PostgREST does not serve (config.toml's [api] schemas): none is callable over /rest/v1/rpc,
-- and only service_role (the caller of begin_turn) may use the schema and execute them
-- (access.sql).
create schema if not exists crossmem_private;

-- A delivery whose message the person has forgotten (forgetting.sql): answered like a
-- duplicate, storing nothing (no conversation, no message), not even an identity.
create or replace function crossmem_private.delivery_forgotten(p_surface text, p_external_id text, p_user_id uuid)
    returns boolean language plpgsql stable set search_path = '' as $$
begin
    return p_external_id is not null and exists (
        select from public.forgotten_deliveries f
         where f.surface = p_surface and f.external_id = p_external_id
           and (p_surface <> 'web' or f.user_id = p_user_id));
end;
$$;

/* Who writes: p_user_id, or the person of a Telegram chat or WhatsApp sender (a new one for an
   identity never seen). `for key share`: a link of this identity (link_identity holds it `for
   update`) finishes first, and this turn then belongs to the person it was linked to.

   p_sender_alias is the same sender's other id (a WhatsApp number beside its BSUID), one person
   with it: a new sender id joins the person its alias already has (linked as the alias is) unless
   that person writes with another BSUID (the number has passed to someone else, who starts anew);
   an alias never seen joins the sender's person. When the two name different people, the BSUID
   wins: a number can pass to someone else, a BSUID cannot. */
create or replace function crossmem_private.turn_person(p_surface text, p_user_id uuid, p_sender_id text, p_sender_alias text)
    returns uuid language plpgsql set search_path = '' as $$
declare
    v_user uuid := p_user_id;
    v_alias public.identities;
begin
    if v_user is not null then
        return v_user;
    end if;
    if p_sender_id is null or p_surface = 'web' then
        raise exception 'begin_turn needs p_user_id, or p_sender_id on a secondary surface'
            using errcode = '22023';
    end if;
    select i.user_id into v_user
      from public.identities i
     where i.surface = p_surface and i.external_id = p_sender_id
       for key share;
    if p_sender_alias is not null and p_sender_alias <> p_sender_id then
        v_alias := crossmem_private.alias_identity(p_surface, p_sender_id, p_sender_alias);  -- identities.sql
    end if;
    if v_user is null then
        insert into public.identities (surface, external_id, user_id, linked_at)
             values (p_surface, p_sender_id, coalesce(v_alias.user_id, gen_random_uuid()), v_alias.linked_at)
        on conflict (surface, external_id) do nothing
        returning user_id into v_user;
        if v_user is null then  -- another delivery of this sender made it first
            select i.user_id into v_user
              from public.identities i
             where i.surface = p_surface and i.external_id = p_sender_id
               for key share;
        elsif v_alias.user_id is null then
            -- a new person: if this chat was unlinked today, what it spent comes back (links.sql)
            perform crossmem_private.claim_unlinked_usage(p_surface, p_sender_id, v_user);
        end if;
    end if;
    if p_sender_alias is not null and p_sender_alias <> p_sender_id and v_alias.user_id is null then
        insert into public.identities (surface, external_id, user_id, linked_at)
        select p_surface, p_sender_alias, i.user_id, i.linked_at
          from public.identities i
         where i.surface = p_surface and i.external_id = p_sender_id
        on conflict (surface, external_id) do nothing;
    end if;
    return v_user;
end;
$$;

-- Where an unlinked chat's day of usage waits for the person its next message makes: an id
-- derived from the chat, never a person's (a person's ids are random).
create function crossmem_private.unlinked_person(p_surface text, p_external_id text)
    returns uuid language sql immutable set search_path = '' as $$
    select md5('unlinked/' || p_surface || '/' || p_external_id)::uuid;
$$;

-- A new person for a chat takes the usage it left with when it was unlinked (links.sql's unlink_identities).
create function crossmem_private.claim_unlinked_usage(p_surface text, p_external_id text, p_user_id uuid)
    returns void language plpgsql set search_path = '' as $$
declare
    v_waiting uuid := crossmem_private.unlinked_person(p_surface, p_external_id);
begin
    update public.turn_usage u set user_id = p_user_id where u.user_id = v_waiting;
    update public.voice_usage v set user_id = p_user_id where v.user_id = v_waiting;
end;
$$;

-- The delivery's key (messages.sql): this very call tried again after its connection died (its
-- attempt: own_attempt), or a delivery already stored; no row when it is new. One index probe: a
-- delivery with a key is found by it (its own attempt's message has the same key, and
-- own_attempt says whether the attempt is this call's), one without by its attempt.
-- Deliveries of one key take turns here, until the transaction ends.
create or replace function crossmem_private.stored_delivery(
    p_user_id uuid, p_surface text, p_external_id text, p_attempt uuid, out message_id bigint,
    out created_at timestamptz, out conversation_id uuid, out answer_by timestamptz, out own_attempt boolean,
    out declined boolean, out answered_with_later boolean
) language plpgsql set search_path = '' as $$
begin
    if p_external_id is not null then
        perform pg_advisory_xact_lock(
            hashtextextended('delivery/' || p_user_id || '/' || p_surface || '/' || p_external_id, 0));
        -- The row is held until this turn's first transaction ends: a scheduled job claiming it as
        -- owed at this moment is waited for, and its claim (a later answer_by) then seen, so a
        -- redelivery and the job never both take the message over.
        select m.id, m.created_at, m.conversation_id, m.answer_by, coalesce(m.attempt = p_attempt, false), m.declined,
               m.answered_with_later
          into message_id, created_at, conversation_id, answer_by, own_attempt, declined, answered_with_later
          from public.messages m
         where m.user_id = p_user_id and m.surface = p_surface and m.external_id = p_external_id
           for update of m;
    elsif p_attempt is not null then
        select m.id, m.created_at, m.conversation_id, m.answer_by, true, m.declined, m.answered_with_later
          into message_id, created_at, conversation_id, answer_by, own_attempt, declined, answered_with_later
          from public.messages m
         where m.attempt = p_attempt and m.external_id is null and m.user_id = p_user_id
           for update of m;
    end if;
end;
$$;

-- The reply stored for a user message, or null: {"id", "content", "delivered", "declined",
-- "unsent_from"} (messages.sql: the part a send of it starts from, while it is owed).
create or replace function crossmem_private.stored_reply(p_message_id bigint, p_user_id uuid)
    returns jsonb language plpgsql stable set search_path = '' as $$
begin
    return (select jsonb_build_object('id', r.id, 'content', r.content, 'delivered', r.delivered_at is not null,
                                      'declined', r.declined, 'unsent_from', r.unsent_from)
              from public.messages r
             where r.in_reply_to = p_message_id and r.user_id = p_user_id);
end;
$$;

-- When the person's latest message after (p_created_at, p_message_id) that is still being answered
-- (its time not up at p_now, no reply stored) is to be answered by, or null: that turn read the
-- earlier owed message merged with its own and answers it (a redelivery of it asks again then, and
-- the scheduled job leaves it: owed_replies.sql).
create or replace function crossmem_private.later_answer_by(
    p_user_id uuid, p_created_at timestamptz, p_message_id bigint, p_now timestamptz
) returns timestamptz language plpgsql stable set search_path = '' as $$
begin
    return (select max(n.answer_by)
              from public.messages n
             where n.user_id = p_user_id and n.role = 'user' and n.answer_by > p_now
               and (n.created_at, n.id) > (p_created_at, p_message_id)
               and not exists (select from public.messages r where r.in_reply_to = n.id and r.user_id = n.user_id));
end;
$$;

-- The person's budget (budget.sql), when a limit is on: when they may write again, or null.
-- Their instances count one at a time, so two racing for the last allowed turn cannot both pass.
-- A turn (or the scheduled job's answer) that reads p_input and reserves p_reserved, of at most
-- p_output_tokens written a request, starts while the day with all it may spend but its last
-- output (its input, and with tools each request's input and output: the reservation less one
-- output) stays under TOKENS_PER_DAY: the check is the budget's own, against what is left of it
-- then (at least one token: an input past the whole day may start only on a day with nothing counted).
create or replace function crossmem_private.turn_limited_until(
    p_user_id uuid, p_turns_per_minute integer, p_turns_per_day integer, p_tokens_per_day integer,
    p_input integer, p_reserved integer, p_output_tokens integer
) returns timestamptz language plpgsql set search_path = '' as $$
begin
    if p_turns_per_minute <= 0 and p_turns_per_day <= 0 and p_tokens_per_day <= 0 then
        return null;
    end if;
    perform pg_advisory_xact_lock(hashtextextended('budget/' || p_user_id, 0));
    return public.turn_budget_until(
        p_user_id, p_turns_per_minute, p_turns_per_day,
        case when p_tokens_per_day > 0
             then greatest(p_tokens_per_day - greatest(p_input, p_reserved - greatest(p_output_tokens, 0)), 1)
             else 0 end);
end;
$$;

-- What a turn's model request reads, in tokens, estimated before the model is asked (as
-- core/model/llm.py's approximate_tokens: about four characters a token in the Latin alphabet, one
-- a CJK character; counted in eighths of a token, 3 a UTF-8 byte less 1 a character): p_fixed_tokens (what the caller
-- knows: the system prompt, the tools, the web client's history, an allowance for media), the
-- message, the person's notes and the stored messages its window may hold: on the web the
-- conversation's latest and the other apps' latest since p_since, elsewhere the person's latest
-- since p_since. An estimate of the window, not the window (turn_context): it is read before the
-- message is stored, for the budget's check, and reads at most as many rows as the window.
create or replace function crossmem_private.turn_input_tokens(
    p_user_id uuid, p_surface text, p_conversation_id uuid, p_content text, p_since timestamptz,
    p_max_messages integer, p_web_prepend integer, p_fixed_tokens integer
) returns integer language plpgsql stable set search_path = '' as $$
declare
    v_eighths bigint;
begin
    if p_surface = 'web' then
        -- From the conversation's mark on (context.sql's conversation_length: its latest messages
        -- follow it), so that no plan reads a conversation of months: the one PL/pgSQL keeps after
        -- five calls read the conversation's and the person's index entries whole (10 ms at 20,000).
        select coalesce(sum(3 * octet_length(w.content) - char_length(w.content)), 0) into v_eighths
          from (select m.content from public.messages m
                 where m.user_id = p_user_id and m.conversation_id = p_conversation_id
                   and m.created_at >= coalesce((select c.counted_at from public.conversations c
                                                  where c.id = p_conversation_id and c.user_id = p_user_id),
                                                '-infinity')
                 order by m.created_at desc, m.id desc limit p_max_messages) w;
        v_eighths := v_eighths + (select coalesce(sum(3 * octet_length(w.content) - char_length(w.content)), 0)
                                    from crossmem_private.chats_latest(p_user_id, p_since, 'infinity', 0, p_web_prepend,
                                                                      p_conversation_id) w);
    else
        select coalesce(sum(3 * octet_length(w.content) - char_length(w.content)), 0) into v_eighths
          from (select m.content from public.messages m
                 where m.user_id = p_user_id and m.created_at >= p_since
                 order by m.created_at desc, m.id desc limit p_max_messages) w;
    end if;
    v_eighths := v_eighths + 3 * octet_length(p_content) - char_length(p_content)
                 + coalesce((select 3 * octet_length(n.content) - char_length(n.content) from public.memory_notes n
                              where n.user_id = p_user_id and n.revision > 0), 0);
    return least(greatest(p_fixed_tokens, 0) + v_eighths / 8, 2000000000);
end;
$$;

-- What a turn's attempt spent, settled (budget.sql): the tokens it reserved (p_reserved, never
-- more than is still reserved: a retried call gives nothing back twice) given back, and what it
-- spent added. p_user_id, when given, is whose count it must be. p_attempt, when given, is the
-- attempt settling, once: a call retried after its commit (its answer lost with its connection)
-- counts nothing again, nor gives back what another attempt reserved. finish_turn gives none: a
-- retried finish_turn finds its reply stored and settles nothing.
create or replace function crossmem_private.settle_turn_tokens(
    p_message_id bigint, p_user_id uuid, p_reserved integer, p_tokens integer, p_attempt uuid
) returns void language plpgsql set search_path = '' as $$
begin
    if p_reserved = 0 and p_tokens = 0 then
        return;  -- nothing reserved nor spent: the update would change nothing
    end if;
    update public.turn_usage u
       set tokens = crossmem_private.settled(u.tokens, u.reserved, p_reserved, p_tokens),
           reserved = crossmem_private.settled(u.reserved, u.reserved, p_reserved, 0),
           settled = case when p_attempt is null then u.settled else u.settled || p_attempt end
     where u.message_id = p_message_id and (p_user_id is null or u.user_id = p_user_id)
       and (p_attempt is null or p_attempt <> all(u.settled));
end;
$$;

-- The conversation a new message goes to: on the web the one named (null when it is not the
-- person's; one started empty takes the message as its title, and is written in from then on:
-- conversations.sql's `written`) or a new one titled by it;
-- elsewhere the person's one conversation of that surface (the unique partial index settles a
-- race between two first messages).
create or replace function crossmem_private.turn_conversation(p_user_id uuid, p_surface text,
    p_conversation_id uuid, p_content text) returns uuid language plpgsql set search_path = '' as $$
declare
    v_conversation uuid;
begin
    if p_surface = 'web' and p_conversation_id is null then
        insert into public.conversations (user_id, surface, title, written)
             values (p_user_id, 'web', left(regexp_replace(p_content, '\s+', ' ', 'g'), 60), true)
          returning id into v_conversation;
    elsif p_surface = 'web' then
        -- its first message only: once written in, the row is left as it is
        update public.conversations c
           set title = case when c.title = '' then left(regexp_replace(p_content, '\s+', ' ', 'g'), 60)
                            else c.title end,
               written = true
         where c.id = p_conversation_id and c.user_id = p_user_id and c.surface = 'web' and not c.written;
        select c.id into v_conversation
          from public.conversations c where c.id = p_conversation_id and c.user_id = p_user_id;
    else
        select c.id into v_conversation
          from public.conversations c where c.user_id = p_user_id and c.surface = p_surface;
        if v_conversation is null then
            insert into public.conversations (user_id, surface, title)
                 values (p_user_id, p_surface, public.conversation_title(p_surface))
            on conflict (user_id, surface) where surface <> 'web' do nothing;
            select c.id into v_conversation
              from public.conversations c where c.user_id = p_user_id and c.surface = p_surface;
        end if;
    end if;
    return v_conversation;
end;
$$;

-- A reply as the model reads it and memory keeps it: the text it quotes, then its own. Stored so,
-- every later turn shows it alike (the prompt's prefix stays the same) and memory search, the
-- digest and the web read what the model read, as a photo's `[photo: …] caption` is stored.
-- A SQL-standard body, bound when it is created (no search_path can change what it calls), so the
-- planner inlines it where it is called: with `set search_path` it was a call planned again at
-- every message stored (40 µs of each begin_turn).
create or replace function crossmem_private.quoting(p_quoted text, p_content text) returns text
    language sql immutable parallel safe
    return case when p_quoted is null then p_content else '[replying to: "' || p_quoted || '"] ' || p_content end;

-- What a reply quotes and the stored message it answers: p_reply_ref is the platform's name for
-- the message replied to, looked up among this person's own messages of the surface (never
-- anyone else's); p_quoted the text the platform gave (Telegram's quote, or the replied message's
-- text), else the stored message's own words (a WhatsApp reply carries only a Sid), without its
-- own quote or edit mark. One line, at most 300 characters: enough to know which message is meant.
create or replace function crossmem_private.reply_quote(
    p_user_id uuid, p_surface text, p_reply_ref text, p_quoted text, out replied_to bigint, out quoted text
) language plpgsql stable set search_path = '' as $$
declare
    v_words text;
begin
    if p_reply_ref is null and p_quoted is null then
        return;  -- not a reply: most messages
    end if;
    if p_reply_ref is not null then
        select m.id, substr(case when m.edited_at is null then m.content
                                 else regexp_replace(m.content, ' \(edited\)$', '') end,
                            char_length(crossmem_private.quoting(m.quoted, '')) + 1)
          into replied_to, v_words
          from public.messages m
         where m.user_id = p_user_id and m.surface = p_surface and m.platform_ref = p_reply_ref
         order by m.id desc
         limit 1;
    end if;
    quoted := nullif(btrim(regexp_replace(coalesce(nullif(btrim(p_quoted), ''), v_words, ''), '\s+', ' ', 'g')), '');
    if char_length(quoted) > 300 then
        quoted := left(quoted, 299) || '…';
    end if;
end;
$$;

-- Store the user message (its key was looked up under its lock: the insert meets no other
-- delivery of it), counted for the budget when a limit is on, with the tokens its turn reserves,
-- and the id its reply will be stored under (messages.sql's reply_id).
create or replace function crossmem_private.store_user_message(
    p_user_id uuid, p_conversation_id uuid, p_surface text, p_content text,
    p_external_id text, p_attempt uuid, p_answer_by timestamptz, p_sender text, p_counted boolean,
    p_platform_ref text, p_replied_to bigint, p_quoted text, p_reserved integer,
    out message_id bigint, out created_at timestamptz, out reply_id bigint
) language plpgsql set search_path = '' as $$
begin
    insert into public.messages (conversation_id, user_id, surface, role, content, external_id, attempt,
                                 answer_by, sender, platform_ref, replied_to, quoted, reply_id)
         values (p_conversation_id, p_user_id, p_surface, 'user',
                 crossmem_private.quoting(p_quoted, p_content), p_external_id, p_attempt,
                 p_answer_by, p_sender, p_platform_ref, p_replied_to, p_quoted,
                 nextval('public.messages_id_seq'))
      returning id, messages.created_at, messages.reply_id into message_id, created_at, reply_id;
    if p_counted then
        insert into public.turn_usage (message_id, user_id, at, tokens, reserved, surface, sender)
             values (message_id, p_user_id, created_at, p_reserved, p_reserved, p_surface, p_sender);
    end if;
end;
$$;

-- What the model reads with the message (p_message_id, at p_message_at): on the web the
-- conversation's own window and the latest messages of the person's other apps since p_since (but
-- that conversation's, when the page is in a chat's thread); elsewhere the person's window over every conversation; and the
-- person's notes. Its parts are returned apart, for begin_turn's one answer. Not `stable`: the
-- web's count of its conversation may move the conversation's mark (context.sql).
create or replace function crossmem_private.turn_context(
    p_user_id uuid, p_surface text, p_conversation_id uuid,
    p_message_id bigint, p_message_at timestamptz, p_since timestamptz,
    p_window_hours integer, p_max_messages integer, p_window_step integer, p_web_prepend integer,
    out conversation_surface text, out history json, out prepend json, out notes text
) language plpgsql set search_path = '' as $$
declare
    v_length record;
begin
    prepend := '[]'::json;
    if p_surface = 'web' then
        select c.surface into conversation_surface from public.conversations c where c.id = p_conversation_id;
        v_length := crossmem_private.conversation_length(p_user_id, p_conversation_id, p_message_at, p_message_id,
                                                         p_max_messages, p_window_step);
        history := public.context_window(p_user_id, p_conversation_id, v_length.since, p_message_at, p_message_id,
                                         p_max_messages, p_window_step, v_length.total);
        -- A web conversation, or a chat's thread the web page is in (the person types at their desk in
        -- their [Telegram] one): the other apps' latest before it, as Telegram itself reads them.
        if p_web_prepend > 0 then
            -- the window's shape (context.sql): its columns, oldest first, and the ids read marked
            select case when count(*) = 0 then '[]'::json
                        else json_build_array(array_agg(s.id), array_agg(s.conversation_id), array_agg(s.surface),
                                              array_agg(s.role), array_agg(s.content), array_agg(s.created_at),
                                              array_agg(s.id) filter (where s.answering)) end
              into prepend
              from (select l.* from crossmem_private.chats_latest(p_user_id, p_since, p_message_at, p_message_id,
                                                                  p_web_prepend, p_conversation_id) l
                     order by l.created_at, l.id) s;
        end if;
    else
        conversation_surface := p_surface;  -- the person's one conversation of it (turn_conversation)
        history := public.context_window(p_user_id, null, p_message_at - make_interval(hours => p_window_hours),
                                         p_message_at, p_message_id, p_max_messages, p_window_step, null);
    end if;
    select n.content into notes from public.memory_notes n where n.user_id = p_user_id and n.revision > 0;
end;
$$;


-- A message from a chat or number that has opted out (identities.sql: an SMS number after STOP,
-- every send to which Twilio refuses until START, error 21610), which begin_turn answers with
-- this: stored in the person's thread, once (a redelivery finds it by its key, under its lock), for
-- it is their memory on every surface; and answered by nobody: no model asked (its answer would be
-- refused), no tokens reserved, and owed to nobody (no attempt holds it, and a stopped_generations
-- row says no reply is wanted, as give_up_owed's does: claim_owed_replies passes it by). Bounded as
-- every message of the person's is (docs/decisions.md): a new one counts one turn of the budget (no
-- tokens) and past it is not stored, with no answer either ("message_id" null, "limited_until").
-- {"opted_out": true}, with the message.
create or replace function crossmem_private.opted_out_message(
    p_user_id uuid, p_surface text, p_content text, p_external_id text, p_attempt uuid, p_sender text,
    p_platform_ref text, p_reply_ref text, p_quoted text, p_language text,
    p_turns_per_minute integer, p_turns_per_day integer, p_tokens_per_day integer
) returns json language plpgsql set search_path = '' as $$
declare
    v_stored record;
    v_conversation uuid;
    v_quote record;
    v_message bigint;
    v_limited_until timestamptz;
begin
    v_stored := crossmem_private.stored_delivery(p_user_id, p_surface, p_external_id, p_attempt);
    v_conversation := v_stored.conversation_id;
    v_message := v_stored.message_id;
    if v_message is null then
        v_limited_until := crossmem_private.turn_limited_until(
            p_user_id, p_turns_per_minute, p_turns_per_day, p_tokens_per_day, 0, 0, 0);
        if v_limited_until is not null then
            return json_build_object('user_id', p_user_id, 'opted_out', true, 'limited_until', v_limited_until,
                                     'message_id', null, 'language', p_language);
        end if;
        v_conversation := crossmem_private.turn_conversation(p_user_id, p_surface, null, p_content);
        v_quote := crossmem_private.reply_quote(p_user_id, p_surface, p_reply_ref, p_quoted);
        select s.message_id into v_message
          from crossmem_private.store_user_message(
                   p_user_id, v_conversation, p_surface, p_content, p_external_id, p_attempt, clock_timestamp(),
                   p_sender, p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0,
                   p_platform_ref, v_quote.replied_to, v_quote.quoted, 0) s;
        insert into public.stopped_generations (message_id, user_id) values (v_message, p_user_id);
    end if;
    return json_build_object(
        'user_id', p_user_id, 'conversation_id', v_conversation, 'message_id', v_message,
        'duplicate', coalesce(not v_stored.own_attempt, false), 'opted_out', true, 'reply', null,
        'history', '[]'::json, 'prepend', '[]'::json, 'language', p_language);
end;
$$;

-- One turn's first round trip, one call in one transaction, of the parts above: who writes,
-- the delivery's key (a redelivery stores nothing and returns the reply already stored for it,
-- if any; an owed message is taken over), the budget, the conversation, the message, the
-- context the model reads with it, and what the person's follow-ups need (follow_ups.sql's
-- turn_follow_ups). A message from an SMS number that opted out is stored (within the budget) and
-- answered by nobody (opted_out_message). Every setting is an argument (the settings hold the defaults). Its answer is
-- json, built once: every turn reads it.
--
-- With TOKENS_PER_DAY on, the turn's tokens are reserved here (budget.sql), in the budget's lock:
-- its input is estimated (turn_input_tokens: p_input_tokens, what the caller knows, and the window
-- and notes it will read), and the turn may start while the person's day (spent, and reserved by
-- their turns still running) with that input stays under TOKENS_PER_DAY; it then reserves
-- p_requests times its input and p_output_tokens (the most a request writes), answered as
-- 'reserved', which finish_turn or end_attempt settle. Concurrent turns thus pass the day by at
-- most one turn's output (when each spends within its reservation). p_requests 0 reserves nothing.
create or replace function public.begin_turn(
    -- the delivery
    p_surface text, p_content text, p_external_id text, p_user_id uuid, p_sender_id text, p_conversation_id uuid,
    -- the context (CONTEXT_WINDOW_HOURS, CONTEXT_MAX_MESSAGES, CONTEXT_WINDOW_STEP, WEB_PREPEND_MESSAGES)
    p_window_hours integer, p_max_messages integer, p_window_step integer, p_web_prepend integer,
    -- this attempt, the budget (TURNS_PER_MINUTE, TURNS_PER_DAY, TOKENS_PER_DAY), the owed-reply rule
    p_attempt uuid, p_turns_per_minute integer, p_turns_per_day integer, p_tokens_per_day integer,
    p_answer_within_seconds integer, p_sender text,
    -- the sender's other id (a WhatsApp number beside its BSUID), kept as the same person
    p_sender_alias text,
    -- whether the surface's senders opt out at the platform (its adapter's `opts_out`: SMS's STOP)
    p_opts_out boolean,
    -- the platform's name for this message, and for the one it replies to with the text it quotes
    p_platform_ref text, p_reply_ref text, p_quoted text,
    -- the turn's reservation: what each request reads besides the window and the notes, the most it
    -- writes (ANTHROPIC_MAX_TOKENS), and how many requests it may make
    p_input_tokens integer, p_output_tokens integer, p_requests integer,
    -- the language the request states (a primary tag; null: it states none), kept as the person's
    p_language text
) returns json language plpgsql set search_path = '' as $$
declare
    v_now timestamptz := clock_timestamp();
    v_user uuid;
    v_stored record;
    v_reply jsonb;
    v_sending uuid;
    v_owed boolean := false;
    v_edited_away boolean := false;  -- replaced by the web's edit, and sent again by its app (below)
    v_later_by timestamptz;  -- a later message's answer_by, whose turn answers this owed one (merged)
    v_limited_until timestamptz;
    v_conversation uuid;
    v_message record;
    v_context record;
    v_follow_ups record;
    v_quote record;
    v_quoted text;
    v_input integer := 0;
    v_reserved integer := 0;
    v_language text;
begin
    if crossmem_private.delivery_forgotten(p_surface, p_external_id, p_user_id) then
        -- A web page's id of a message it deleted, sent in a conversation it still has (one id is
        -- one message of the person's, below): refused as such, not answered with nothing.
        if exists (select from public.conversations c where c.id = p_conversation_id and c.user_id = p_user_id) then
            return json_build_object('error', 'key_of_another_conversation');
        end if;
        return json_build_object('forgotten', true, 'duplicate', true, 'reply', null,
                                 'history', '[]'::json, 'prepend', '[]'::json);
    end if;
    v_user := crossmem_private.turn_person(p_surface, p_user_id, p_sender_id, p_sender_alias);
    v_language := crossmem_private.remember_language(v_user, p_language, null);  -- follow_ups.sql
    -- A surface whose senders opt out (identities.sql; its adapter says so): the person's opted-out
    -- chats or numbers there read, as the job reads them; every other turn reads nothing more.
    if p_opts_out and crossmem_private.opted_out_of(v_user, p_surface) ? p_sender then
        return crossmem_private.opted_out_message(v_user, p_surface, p_content, p_external_id, p_attempt, p_sender,
                                                  p_platform_ref, p_reply_ref, p_quoted, v_language,
                                                  p_turns_per_minute, p_turns_per_day, p_tokens_per_day);
    end if;

    v_stored := crossmem_private.stored_delivery(v_user, p_surface, p_external_id, p_attempt);
    -- A key names one message of the person's: a request that names another conversation for it (a
    -- page whose message ids repeat in every chat) is refused, neither answered with that message's
    -- reply nor answered there.
    if v_stored.conversation_id <> p_conversation_id then
        return json_build_object('error', 'key_of_another_conversation');
    end if;
    if v_stored.message_id is not null and not v_stored.own_attempt then
        v_reply := crossmem_private.stored_reply(v_stored.message_id, v_user);
        -- Owed: no reply, and its attempt can no longer answer. This delivery answers it (within
        -- the budget: each attempt's tokens count, so retrying an abandoned stream for ever runs
        -- into TOKENS_PER_DAY).
        -- A message a later turn declined with itself (turn.sql's mark_declined), or answered with
        -- its own (finish_turn's p_merged), is answered by it.
        -- One edited away on the web's page of its thread (messages.sql's replaced: its edit has its
        -- own answer) is owed no more to its app's redelivery (a delivery with a sender), as the
        -- scheduled job leaves it (owed_replies.sql); the page sending it again (an edit back to its
        -- words, another tab's Try again) still takes it over.
        v_edited_away := v_reply is null and p_sender is not null
                         and exists (select from public.messages m where m.id = v_stored.message_id and m.replaced);
        v_owed := v_reply is null and not v_stored.declined and not v_stored.answered_with_later and not v_edited_away
                  and (v_stored.answer_by is null or v_stored.answer_by <= v_now);
        if v_owed then
            -- A later message of the person's still being answered read it owed, merged with its own
            -- (as the job leaves it, owed_replies.sql): that turn answers it, and this delivery asks
            -- again once its time is up (answered with it then, or owed again); taken over, it was
            -- answered twice. In the person's owed lock, alone: a later message's turn beginning now
            -- (it holds the lock shared, below) is waited for and seen, and one beginning after this
            -- reads the message taken over, marked.
            perform pg_advisory_xact_lock(hashtextextended('owed/' || v_user, 0));
            v_later_by := crossmem_private.later_answer_by(v_user, v_stored.created_at, v_stored.message_id, v_now);
            v_owed := v_later_by is null;
        end if;
        if v_reply->>'unsent_from' is not null then
            -- Its reply is stored and owed a send (messages.sql's unsent_from): this delivery sends
            -- it, holding the message as an attempt does, unless another is sending it now (the
            -- scheduled job, another delivery): then it asks again later, as for an answer.
            -- Its holder is a token of its own (as the job's claim), not this call's attempt: this
            -- call tried again after its connection died is then a delivery like the others.
            if v_stored.answer_by > v_now then
                v_reply := null;
            else
                update public.messages m
                   set answer_by = v_now + make_interval(secs => p_answer_within_seconds), attempt = gen_random_uuid()
                 where m.id = v_stored.message_id
                returning m.attempt into v_sending;
            end if;
        end if;
        if not v_owed then
            return json_build_object(
                'user_id', v_user, 'conversation_id', v_stored.conversation_id,
                'conversation_surface',
                (select c.surface from public.conversations c where c.id = v_stored.conversation_id),
                'message_id', v_stored.message_id, 'duplicate', true, 'reply', v_reply,
                -- an answer repeated where follow-ups wait for a window: with the held ones it said first
                'delivered_first', case when public.surface_has_window(p_surface)
                                        then crossmem_private.follow_ups_said_with(v_stored.message_id) end,
                -- Not answered yet (or its reply being sent), and its attempt may still, or a later
                -- message's turn that read it merged: ask again after this.
                'answer_by', case when v_later_by is not null then v_later_by
                                  when v_reply is null and (not (v_stored.declined or v_stored.answered_with_later
                                                                 or v_edited_away)
                                                            or v_stored.answer_by > v_now)
                                  then v_stored.answer_by end,
                -- declined with a later turn, which answered it (mark_declined)
                'declined', v_stored.declined,
                -- holding its reply's send: what record_delivery is told
                'attempt', v_sending,
                'history', '[]'::json, 'prepend', '[]'::json);
        end if;
    end if;

    -- The person's owed messages this turn reads, it answers with its own (merged): the scheduled
    -- job claiming one of them now is waited for, and its claim seen (read marked, answered by the
    -- job), and one that finds this lock held leaves the person's to this turn (owed_replies.sql).
    -- Taken before the budget's lock, as the claim takes them: the other way round, a turn in the
    -- budget's lock waited for a claim waiting for it (a deadlock, and one of them failed).
    perform pg_advisory_xact_lock_shared(hashtextextended('owed/' || v_user, 0));
    if v_stored.message_id is null or v_owed then
        -- Over the budget (turn_limited_until), nothing is stored and no model is asked. An
        -- answered delivery never gets here.
        if p_tokens_per_day > 0 and p_requests > 0 then
            v_input := crossmem_private.turn_input_tokens(
                v_user, p_surface, coalesce(v_stored.conversation_id, p_conversation_id), p_content,
                v_now - make_interval(hours => p_window_hours), p_max_messages, p_web_prepend, p_input_tokens);
            v_reserved := least(p_requests::bigint * (v_input + greatest(p_output_tokens, 0)), 2000000000);
        end if;
        v_limited_until := crossmem_private.turn_limited_until(
            v_user, p_turns_per_minute, p_turns_per_day, p_tokens_per_day, v_input, v_reserved, p_output_tokens);
        if v_limited_until is not null then
            -- the pause is said on the person's clock (core/phrases/refusals.py)
            return json_build_object('user_id', v_user, 'limited_until', v_limited_until, 'language', v_language,
                                     'timezone', (select t.timezone from public.person_timezones t
                                                   where t.user_id = v_user));
        end if;
    end if;

    if v_stored.message_id is not null then
        -- This call's own earlier attempt, or an owed message it now answers.
        if v_owed then
            update public.messages m
               set answer_by = v_now + make_interval(secs => p_answer_within_seconds), attempt = p_attempt
             where m.id = v_stored.message_id;
            -- This attempt's reservation beside the earlier attempt's, which stays: that attempt
            -- may have spent it before its instance died, or still settles it when it ends.
            update public.turn_usage u set tokens = u.tokens + v_reserved, reserved = u.reserved + v_reserved
             where u.message_id = v_stored.message_id;
            if not found then
                v_reserved := 0;  -- stored when no limit was on: nothing to count it in
            end if;
        else
            -- This call's own first try, which committed: what it reserved is this attempt's.
            select u.reserved into v_reserved from public.turn_usage u where u.message_id = v_stored.message_id;
        end if;
        v_conversation := v_stored.conversation_id;
        select m.id as message_id, v_stored.created_at as created_at, m.reply_id, m.quoted into v_message
          from public.messages m where m.id = v_stored.message_id and m.user_id = v_user;
        v_quoted := v_message.quoted;
    else
        v_conversation := crossmem_private.turn_conversation(v_user, p_surface, p_conversation_id, p_content);
        if v_conversation is null then
            return json_build_object('error', 'conversation_not_found');
        end if;
        v_quote := crossmem_private.reply_quote(v_user, p_surface, p_reply_ref, p_quoted);
        v_message := crossmem_private.store_user_message(
            v_user, v_conversation, p_surface, p_content, p_external_id, p_attempt,
            v_now + make_interval(secs => p_answer_within_seconds), p_sender,
            p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0,
            p_platform_ref, v_quote.replied_to, v_quote.quoted, v_reserved);
        v_quoted := v_quote.quoted;
    end if;

    v_context := crossmem_private.turn_context(v_user, p_surface, v_conversation, v_message.message_id,
                                               v_message.created_at, v_now - make_interval(hours => p_window_hours),
                                               p_window_hours, p_max_messages, p_window_step, p_web_prepend);
    v_follow_ups := crossmem_private.turn_follow_ups(v_user, p_surface, v_message.message_id);
    return json_build_object(
        'user_id', v_user, 'conversation_id', v_conversation, 'message_id', v_message.message_id,
        'duplicate', false, 'owed', v_owed, 'attempt', p_attempt, 'reply', null,
        'conversation_surface', v_context.conversation_surface, 'history', v_context.history,
        'prepend', v_context.prepend, 'notes', v_context.notes,
        'follow_ups', v_follow_ups.pending, 'timezone', v_follow_ups.timezone,
        'timezone_stated', v_follow_ups.timezone_stated,
        'delivered_first', v_follow_ups.delivered_first, 'follow_up_apps', v_follow_ups.apps, 'quoted', v_quoted,
        'reserved', coalesce(v_reserved, 0), 'language', v_language,
        -- The id finish_turn stores the reply under, drawn when the message was stored (every
        -- attempt at it names the same) so that the web's stream names the reply before its first
        -- word. A message that gets no reply leaves a gap, and a reply stored later than a message
        -- with a higher id is ordered by its time, as every message is: (created_at, id).
        'reply_id', v_message.reply_id);
end;
$$;

-- The user message rewritten as its turn learned it (issue #20): begin_turn stored a placeholder
-- ("[voice note, 0:42, not transcribed]"), the turn that fetched, transcribed or looked at what was
-- sent stores "[voice note, 0:42] the transcript" or "[photo: what it shows] caption", in the round
-- trip that ends the turn. Null leaves the message as stored. A redelivery finds the message
-- answered and fetches nothing: the download and the transcription are part of the turn's
-- idempotency.
-- plpgsql (its plan kept for the session) and a null content returns at once: every
-- end_attempt calls it (finish_turn only with a content), and a `language sql` one was planned
-- again at each call.
create or replace function public.rewrite_user_message(p_user_id uuid, p_user_message_id bigint, p_content text)
    returns void language plpgsql set search_path = '' as $$
begin
    if p_content is null then
        return;
    end if;
    update public.messages m set content = crossmem_private.quoting(m.quoted, p_content)
     where m.id = p_user_message_id and m.role = 'user'
       and (m.user_id = p_user_id
            or exists (select from public.merged_people x
                        where x.from_user_id = p_user_id and x.into_user_id = m.user_id));
end;
$$;

-- One turn's second round trip: store the reply to a user message (once), under the id its
-- begin_turn reserved (p_reply_id; null, the next one: the scheduled job's replies), touch the
-- conversation and settle the turn's model tokens (p_tokens spent, p_reserved given back) beside
-- what its earlier attempts spent; the user message rewritten as the turn learned it
-- (p_user_content, null: as stored). A message whose person has since been merged into another
-- takes the reply; a retried finish_turn whose first try committed gets the reply's id back (and
-- counts nothing again); another reply to the same message (another attempt's: the same reserved
-- id, other words) is refused (null), its tokens settled.
-- A turn the model declined, marked (messages.sql's `declined`; its reply is stored marked): the
-- person's message, and p_merged (a JSON array of ids), the stored messages the context's last turn
-- merged with it (core/turn/context.py's merged_into_last: theirs, after the latest reply shown and
-- the latest shown answered separately), but one answered, or still being answered by an attempt of
-- its own (its answer decides). Left unmarked, one that caused the refusal would have every next turn
-- declined, and the job answer it.
create function crossmem_private.mark_declined(p_user_id uuid, p_message_id bigint, p_merged text)
    returns void language plpgsql set search_path = '' as $$
begin
    update public.messages m set declined = true
     where m.user_id = p_user_id and m.role = 'user'
       and (m.id = p_message_id
            or m.id in (select e::bigint from json_array_elements_text(coalesce(nullif(p_merged, ''), '[]')::json) e)
               and (m.answer_by is null or m.answer_by <= clock_timestamp())
               and not exists (select from public.messages x where x.in_reply_to = m.id));
end;
$$;

-- The messages of the person's that a turn's answer (finish_turn) merged in its last turn (p_merged,
-- a JSON array of ids): each with no reply of its own and no attempt that may still answer it
-- (its attempt ended: the fallback sent, the time up) is answered with that reply. Left owed, the
-- scheduled job or its redelivery would answer it again, after the answer that took it in. One an
-- attempt holds (the job's claim, a redelivery) is left to it: its answer decides. Taken in the
-- order of their ids, so two answers merging the same ones never deadlock.
create function crossmem_private.mark_answered_with(p_user_id uuid, p_merged text)
    returns void language plpgsql set search_path = '' as $$
begin
    update public.messages m set answered_with_later = true
     where m.id in (select x.id from public.messages x
                     where x.user_id = p_user_id and x.role = 'user'
                       and x.id in (select e::bigint from json_array_elements_text(coalesce(nullif(p_merged, ''), '[]')::json) e)
                     order by x.id
                       for no key update of x)
       and m.user_id = p_user_id and not m.declined
       and (m.answer_by is null or m.answer_by <= clock_timestamp())
       and not exists (select from public.messages r where r.in_reply_to = m.id);
end;
$$;

-- The conversation of p_user_id's message p_message_id (or of the person they were linked into
-- since: their rows moved there), locked key share, as a link takes it first: finish_turn and
-- end_attempt take it before the message's rows, so one ending while its chat is linked waits for
-- the link and never deadlocks with it.
create function crossmem_private.hold_conversation_of(p_user_id uuid, p_message_id bigint) returns void
    language plpgsql set search_path = '' as $$
begin
    perform from public.conversations c
     where c.id = (select m.conversation_id from public.messages m
                    where m.id = p_message_id
                      and (m.user_id = p_user_id
                           or m.user_id = (select x.into_user_id from public.merged_people x
                                            where x.from_user_id = p_user_id)))
       for key share of c;
end;
$$;

create or replace function public.finish_turn(
    p_user_id uuid,
    p_user_message_id bigint,
    p_content text,
    p_delivered boolean,
    -- not delivered for a reason that may pass: the first part not sent (messages.sql's
    -- unsent_from), and the message, while p_attempt still holds it, is free at once for the
    -- redelivery or the job to send it from there; null: delivered, or given up
    p_unsent_from integer,
    p_attempt uuid,
    p_tokens integer,
    p_user_content text,
    p_reserved integer,
    p_reply_id bigint,
    p_language text,  -- the language the turn heard, kept as the person's (null: none)
    -- the model declined the turn (null: it did not): p_content says so, and the message, its reply
    -- and the person's other messages its last turn merged (a JSON array of their ids) are marked
    -- declined (messages.sql), out of every later context
    p_declined text,
    -- the model answered the turn: the person's other stored messages its last turn merged (a JSON
    -- array of their ids), answered with it (answered_with_later) when nothing else answers them
    p_merged text
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_reply_id bigint;
    v_owner uuid;
begin
    -- The message's conversation first, as a link takes it (before the messages and the language):
    -- a reply stored while its chat is linked waits for the link, never deadlocks with it, and is
    -- then stored where the link moved the message, the person's (with the chat's old id, it was
    -- out of every context). Once the reply is stored, a link waits for this turn, and moves it.
    perform crossmem_private.hold_conversation_of(p_user_id, p_user_message_id);
    -- null: nothing learned, and nothing to answer with it. Learned from the message: not kept once
    -- a forget took the message (remember_language asks, when it would write).
    if p_language is not null then
        perform crossmem_private.remember_language(p_user_id, p_language, p_user_message_id);
    end if;
    if p_user_content is not null then
        perform public.rewrite_user_message(p_user_id, p_user_message_id, p_user_content);
    end if;
    with asked as (
        select m.id, m.conversation_id, m.user_id, m.surface
          from public.messages m
         where m.id = p_user_message_id and m.role = 'user'
           and (m.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = m.user_id))
    ), stored as (
        -- `overriding system value`: the id is the identity's own, drawn earlier (begin_turn).
        insert into public.messages (id, conversation_id, user_id, surface, role, content, in_reply_to, delivered_at,
                                     unsent_from, declined)
        overriding system value
        select coalesce(p_reply_id, nextval('public.messages_id_seq')), a.conversation_id, a.user_id, a.surface,
               'assistant', p_content, a.id, case when p_delivered then clock_timestamp() end,
               case when not p_delivered then p_unsent_from end, p_declined is not null
          from asked a
        -- on the one reply (in_reply_to) or on its id: two attempts may insert at once, and the
        -- one that waited on the other's id is told that reply below, not an error
        on conflict do nothing
        returning id, conversation_id, user_id
    ), touched as (
        update public.conversations c
           set updated_at = clock_timestamp()
          from stored s
         where c.id = s.conversation_id and c.user_id = s.user_id
    )
    select s.id, s.user_id into v_reply_id, v_owner from stored s;

    if v_reply_id is not null then
        -- settled as this attempt's: its finish_turn retried after this commit settles nothing twice
        perform crossmem_private.settle_turn_tokens(p_user_message_id, null, p_reserved, p_tokens, p_attempt);
        if p_declined is not null then
            perform crossmem_private.mark_declined(v_owner, p_user_message_id, p_declined);
        elsif p_merged is not null then
            perform crossmem_private.mark_answered_with(v_owner, p_merged);
        end if;
        if p_unsent_from is not null and not p_delivered then
            update public.messages m set answer_by = clock_timestamp()
             where m.id = p_user_message_id and m.user_id = v_owner and m.attempt = p_attempt;
        end if;
    else
        select r.id into v_reply_id
          from public.messages r
         where r.in_reply_to = p_user_message_id
           and (r.id = p_reply_id or p_reply_id is null) and r.content = p_content
           and (r.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = r.user_id));
        if v_reply_id is null or p_attempt is not null then
            -- another attempt's reply came first (the same words, under the message's one reply id,
            -- or others): what this one spent counts all the same; its own retried after its commit
            -- (the same attempt, already settled) counts nothing again
            perform crossmem_private.settle_turn_tokens(p_user_message_id, p_user_id, p_reserved, p_tokens, p_attempt);
        end if;
    end if;
    return jsonb_build_object('reply_id', v_reply_id);
end;
$$;

-- A turn that ended without a stored reply (a fallback, an abandoned stream, an error after part
-- of an answer): what the model spent counts (p_tokens, its reservation p_reserved given back),
-- and the message is owed from now on (unless a reply was stored meanwhile, or another attempt
-- took it over); what the turn learned of the message is kept (a transcript survives a model
-- failure). Returns {"owed": boolean}.
create or replace function public.end_attempt(
    p_user_id uuid, p_user_message_id bigint, p_attempt uuid, p_tokens integer, p_user_content text,
    p_reserved integer, p_language text,
    -- the held follow-ups this attempt took (follow_ups.sql's said_with) reached the person with
    -- its answer (a fallback): the next answer to the message does not say them again
    p_said_first boolean,
    -- how far pushing them got when one did not go, as JSON text (as every JSON argument: PostgREST
    -- passes a json parameter a string as a JSON string): [{"id", "unsent_from"}], each follow-up's
    -- first part not out (its count of parts when all are), which the next answer starts from
    p_first_parts text,
    -- with p_said_first, the ones its answer had no room for (a TwiML answer: Twilio's 10
    -- messages), as a JSON array of ids: left to the follow-up job (follow_ups.sql's
    -- send_follow_ups_later) in this round trip, so a database failing after it loses none
    p_said_later text
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_owed boolean;
    v_user uuid;
begin
    -- The message's conversation first, as a link takes it and finish_turn does (a key share: one
    -- ending while its chat is linked waits for the link, holding nothing the link then needs; with
    -- the message first, the link's move of the conversation's follow-ups and the message's own
    -- delete here of its places each waited for the other). Then the message's row, as begin_turn,
    -- the scheduled job's claim and a link take a person's rows (the message before its turn_usage
    -- row, the messages before the language): an attempt ending while the job claims its message
    -- never deadlocks.
    perform crossmem_private.hold_conversation_of(p_user_id, p_user_message_id);
    perform from public.messages m
     where m.id = p_user_message_id
       and (m.user_id = p_user_id
            or m.user_id = (select x.into_user_id from public.merged_people x where x.from_user_id = p_user_id))
       for update of m;
    -- The person, or the one they were linked into since the turn began (their rows moved there),
    -- read once a link that held the message has committed.
    v_user := coalesce((select x.into_user_id from public.merged_people x where x.from_user_id = p_user_id),
                       p_user_id);
    if p_language is not null then  -- as finish_turn
        perform crossmem_private.remember_language(p_user_id, p_language, p_user_message_id);
    end if;
    perform public.rewrite_user_message(p_user_id, p_user_message_id, p_user_content);
    perform crossmem_private.settle_turn_tokens(p_user_message_id, v_user, p_reserved, p_tokens, p_attempt);
    update public.messages m set answer_by = clock_timestamp()
     where m.id = p_user_message_id and m.user_id in (p_user_id, v_user) and m.role = 'user'
       -- only while no later attempt has taken the message over: never two attempts at once
       and m.attempt is not distinct from p_attempt
       and not exists (select from public.messages r where r.in_reply_to = m.id);
    v_owed := found;
    -- The answer this attempt returned (a fallback) said the held follow-ups it took: the next
    -- answer to this message does not say them again. One that said nothing (its time ran out
    -- before its answer, or it failed) leaves them to the next answer.
    if p_said_first then
        update public.follow_ups f set said_with = null
         where f.said_with = p_user_message_id and f.user_id in (p_user_id, v_user);
        if p_said_later is not null then
            perform public.send_follow_ups_later(p_user_id, p_user_message_id, p_said_later);
        end if;
    end if;
    -- The places its schedule tool held (follow_ups.sql's reserve_follow_up): nothing was stored,
    -- so nothing is scheduled; freed at once for the person's next turn (or this message's next answer).
    -- Only while the message is still this attempt's: one that lost it (the job took it over) leaves
    -- the places to the attempt holding it now, whose tool may have taken them.
    if v_owed then
        delete from public.follow_ups f
         where f.asked_in = p_user_message_id and f.user_id in (p_user_id, v_user) and f.status = 'reserved';
    end if;
    -- Parts that went out never go again (never back a part: another attempt may have pushed more).
    update public.follow_ups f set unsent_from = greatest(f.unsent_from, (p.value ->> 'unsent_from')::smallint)
      from json_array_elements(coalesce(p_first_parts, '[]')::json) p
     where f.id = (p.value ->> 'id')::bigint and f.user_id in (p_user_id, v_user)
       and f.said_with = p_user_message_id;
    return jsonb_build_object('owed', v_owed);
end;
$$;

-- What a send of a reply stored but not delivered (the surface was down) came to, by a redelivery
-- or the scheduled job: delivered (p_delivered), still owed from part p_unsent_from (never an
-- earlier part than the row says; the message free at once for the next to try), or given up
-- (neither: the surface refused it for good). A reply owed a send is recorded only by the one
-- holding its message (p_attempt, the token begin_turn or the job's claim took it with): one whose
-- hold ran out and passed to another changes nothing. The message may since belong to the person
-- its sender was merged into.
create or replace function public.record_delivery(
    p_user_id uuid, p_reply_id bigint, p_attempt uuid, p_delivered boolean, p_unsent_from integer
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_reply record;
begin
    update public.messages m
       set delivered_at = case when p_delivered then clock_timestamp() end,
           unsent_from = case when not p_delivered and p_unsent_from is not null
                              then greatest(p_unsent_from, m.unsent_from) end
     where m.id = p_reply_id and m.role = 'assistant' and m.delivered_at is null
       and (m.user_id = p_user_id
            or exists (select from public.merged_people x
                        where x.from_user_id = p_user_id and x.into_user_id = m.user_id))
       and (m.unsent_from is null
            or exists (select from public.messages q
                        where q.id = m.in_reply_to and q.user_id = m.user_id and q.attempt = p_attempt))
    returning m.id, m.in_reply_to, m.user_id, m.unsent_from into v_reply;
    if v_reply.unsent_from is not null then
        update public.messages m set answer_by = clock_timestamp()
         where m.id = v_reply.in_reply_to and m.user_id = v_reply.user_id and m.attempt = p_attempt;
    end if;
    return jsonb_build_object('reply_id', v_reply.id);
end;
$$;

-- A person's correction of their own message (a Telegram edited_message): its text replaced, with
-- what it quotes, marked ` (edited)` for the model (its earlier answer was to the old words); memory
-- search then finds the new words, not the old (search_text follows content). The message is the
-- person's own, named by the platform (p_platform_ref): p_user_id, else the person of p_sender_id
-- (never an identity made here: an edit of a chat never seen finds nothing). An edit the message
-- already has, or an older one (its p_edited_at, the platform's edit_date, is not later than the
-- stored one), changes nothing: a redelivery, or edits delivered out of order. No answer follows,
-- and nothing is counted (docs/decisions.md). Returns {"found", "edited", "message_id"}.
create or replace function public.edit_message(
    p_user_id uuid, p_sender_id text, p_surface text, p_platform_ref text, p_content text,
    p_reply_ref text, p_quoted text, p_edited_at timestamptz
) returns json language plpgsql set search_path = '' as $$
declare
    v_user uuid := p_user_id;
    v_message record;
    v_quote record;
begin
    if v_user is null then
        select i.user_id into v_user
          from public.identities i where i.surface = p_surface and i.external_id = p_sender_id;
    end if;
    select m.id, m.edited_at, m.created_at into v_message
      from public.messages m
     where m.user_id = v_user and m.surface = p_surface and m.platform_ref = p_platform_ref and m.role = 'user'
     order by m.id desc
     limit 1
       for update of m;
    if v_message.id is null then
        return json_build_object('found', false, 'edited', false, 'message_id', null);
    end if;
    if v_message.edited_at >= p_edited_at then
        return json_build_object('found', true, 'edited', false, 'message_id', v_message.id);
    end if;
    v_quote := crossmem_private.reply_quote(v_user, p_surface, p_reply_ref, p_quoted);
    update public.messages m
       set content = crossmem_private.quoting(v_quote.quoted, p_content) || ' (edited)',
           quoted = v_quote.quoted, replied_to = v_quote.replied_to, edited_at = p_edited_at
     where m.id = v_message.id and m.user_id = v_user;
    -- The messages replying to it quote its new words: no earlier version is kept anywhere.
    v_quote := crossmem_private.reply_quote(v_user, p_surface, null, p_content);
    update public.messages r
       set content = crossmem_private.quoting(v_quote.quoted,
                                               substr(r.content, char_length(crossmem_private.quoting(r.quoted, '')) + 1)),
           quoted = v_quote.quoted
     where r.replied_to = v_message.id and r.user_id = v_user;
    -- Notes that hold the message were written from its old words: they go, as forgetting's do,
    -- and the next digest writes them again from the thread as corrected (a running one's write
    -- finds no row). An edit of a message the window still shows leaves them alone. Notes a link
    -- merged (pending_fold) may hold the merged person's messages past their coverage (none, when
    -- the account had no notes): they go too.
    perform crossmem_private.await_notes_claim(v_user);
    delete from public.memory_notes n
     where n.user_id = v_user
       and (n.pending_fold
            or (n.covered_until_at, n.covered_until_id) >= (v_message.created_at, v_message.id));
    -- A digest running meanwhile read the old words: it loses its claim (its write finds none, as
    -- after a link), and the next digest reads the corrected thread.
    update public.memory_notes n set claim = null, claimed_until = null
     where n.user_id = v_user and n.claim is not null;
    return json_build_object('found', true, 'edited', true, 'message_id', v_message.id);
end;
$$;
