-- Every message answered exactly once (issue #23).
--
-- 1. One rule for a delivery's key: (person, surface, external_id). Telegram's update_id and
--    Twilio's MessageSid are unique for the whole bot, so per person is the same thing for
--    them; the web's client_message_id means something only to the person who chose it. The
--    same rule is the unique index, the "already stored" answer and the budget's exemption:
--    a key seen before never reaches the model again, whatever conversation it names.
-- 2. Owed messages. A user message carries `answer_by`: until then its attempt may still
--    answer (the surface's model deadline plus a margin); after it, or once its attempt is
--    known to have ended (`end_attempt`: a fallback, an abandoned stream), a message with no
--    reply is owed. A redelivery of it takes it over (one attempt at a time, by the row's
--    update), and so does the scheduled job (`claim_owed_replies`) for Telegram and WhatsApp,
--    which no platform redelivers for long. `sender` keeps the chat or number it came from,
--    so the job knows where to answer.
-- 3. Every token counted: finish_turn and end_attempt add to turn_usage, never overwrite.
-- 4. Consent before history moves: a code knows the account it belongs to (masked), and
--    redeem_link_code without consent links nothing on a chat that has messages.
-- 5. A missing conversation forgets nothing; folding two people's notes stays within the limit.

alter table public.messages add column answer_by timestamptz;
alter table public.messages add column sender text;
alter table public.messages drop constraint messages_once_per_delivery;
create unique index messages_once_per_delivery on public.messages (user_id, surface, external_id);
-- What the job scans: unanswered user messages of the last minutes, by age.
create index messages_owed on public.messages (created_at) where role = 'user' and sender is not null;

alter table public.link_codes add column account text not null default '';


-- As in 20261130160000_begin_turn_notes.sql, with the delivery's key looked up once, first
-- (1), owed messages taken over (2), and `sender`/`answer_by` stored.
drop function public.begin_turn(text, text, text, uuid, text, uuid, integer, integer, integer, integer, uuid, integer, integer, integer);

create function public.begin_turn(
    p_surface text,
    p_content text,
    p_external_id text,
    p_user_id uuid,
    p_sender_id text,
    p_conversation_id uuid,
    p_window_hours integer,
    p_max_messages integer,
    p_window_step integer,
    p_web_prepend integer,
    p_attempt uuid,
    p_turns_per_minute integer,
    p_turns_per_day integer,
    p_tokens_per_day integer,
    p_answer_within_seconds integer,
    p_sender text
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_user uuid := p_user_id;
    v_conversation uuid;
    v_conversation_surface text;
    v_message_id bigint;
    v_message_at timestamptz;
    v_answer_by timestamptz;
    v_reply jsonb;
    v_now timestamptz := clock_timestamp();
    v_since timestamptz := clock_timestamp() - make_interval(hours => p_window_hours);
    v_history jsonb;
    v_prepend jsonb := '[]'::jsonb;
    v_own_attempt boolean := false;
    v_owed boolean := false;
    v_limited_until timestamptz;
begin
    -- Forgetting (issue #13): a delivery whose message the person has forgotten is answered like a
    -- duplicate, storing nothing (no conversation, no message), not even an identity.
    if p_external_id is not null and exists (
        select from public.forgotten_deliveries f
         where f.surface = p_surface and f.external_id = p_external_id
           and (p_surface <> 'web' or f.user_id = p_user_id)) then
        return jsonb_build_object('forgotten', true, 'duplicate', true, 'reply', null,
                                  'history', '[]'::jsonb, 'prepend', '[]'::jsonb);
    end if;

    if v_user is null then
        if p_sender_id is null or p_surface = 'web' then
            raise exception 'begin_turn needs p_user_id, or p_sender_id on a secondary surface'
                using errcode = '22023';
        end if;
        -- `for key share`: a link of this identity (link_identity holds it `for update`)
        -- finishes first, and this turn then belongs to the person it was linked to.
        select i.user_id into v_user
          from public.identities i
         where i.surface = p_surface and i.external_id = p_sender_id
           for key share;
        if v_user is null then
            insert into public.identities (surface, external_id, user_id)
                 values (p_surface, p_sender_id, gen_random_uuid())
            on conflict (surface, external_id) do nothing;
            select i.user_id into v_user
              from public.identities i
             where i.surface = p_surface and i.external_id = p_sender_id
               for key share;
        end if;
    end if;

    -- The delivery's key, looked up once: this very call tried again after its connection
    -- died (its attempt), or a delivery already stored. Deliveries of one key take turns here.
    if p_external_id is not null then
        perform pg_advisory_xact_lock(hashtextextended('delivery/' || v_user || '/' || p_surface || '/' || p_external_id, 0));
    end if;
    select m.id, m.created_at, m.conversation_id, m.answer_by, coalesce(m.attempt = p_attempt, false)
      into v_message_id, v_message_at, v_conversation, v_answer_by, v_own_attempt
      from public.messages m
     where m.user_id = v_user
       and ((p_attempt is not null and m.attempt = p_attempt)
            or (p_external_id is not null and m.surface = p_surface and m.external_id = p_external_id))
     order by m.attempt = p_attempt desc nulls last
     limit 1;

    if v_message_id is not null and not v_own_attempt then
        select jsonb_build_object('id', r.id, 'content', r.content, 'delivered', r.delivered_at is not null)
          into v_reply
          from public.messages r
         where r.in_reply_to = v_message_id and r.user_id = v_user;
        -- Owed: no reply, and its attempt can no longer answer. This delivery answers it (below,
        -- within the budget: each attempt's tokens count, so retrying an abandoned stream for
        -- ever runs into TOKENS_PER_DAY).
        v_owed := v_reply is null and (v_answer_by is null or v_answer_by <= v_now);
        if not v_owed then
            return jsonb_build_object(
                'user_id', v_user, 'conversation_id', v_conversation,
                'conversation_surface', (select c.surface from public.conversations c where c.id = v_conversation),
                'message_id', v_message_id, 'duplicate', true, 'reply', v_reply,
                -- Not answered yet, and its attempt may still answer: ask again after this.
                'answer_by', case when v_reply is null then v_answer_by end,
                'history', '[]'::jsonb, 'prepend', '[]'::jsonb);
        end if;
    end if;

    if (v_message_id is null or v_owed) and (p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0) then
        -- The person's budget (20261130145000): their instances count one at a time, so two
        -- racing for the last allowed turn cannot both pass. Over it, nothing is stored and no
        -- model is asked. An answered delivery never gets here.
        perform pg_advisory_xact_lock(hashtextextended('budget/' || v_user, 0));
        v_limited_until := public.turn_budget_until(v_user, p_turns_per_minute, p_turns_per_day, p_tokens_per_day);
        if v_limited_until is not null then
            return jsonb_build_object('user_id', v_user, 'limited_until', v_limited_until);
        end if;
    end if;

    if v_owed then
        update public.messages m
           set answer_by = v_now + make_interval(secs => p_answer_within_seconds), attempt = p_attempt
         where m.id = v_message_id;
    end if;

    if v_message_id is null then
        if p_surface = 'web' then
            v_conversation := p_conversation_id;
            if v_conversation is null then
                insert into public.conversations (user_id, surface, title)
                     values (v_user, 'web', left(regexp_replace(p_content, '\s+', ' ', 'g'), 60))
                  returning id into v_conversation;
            else
                select c.id into v_conversation
                  from public.conversations c
                 where c.id = v_conversation and c.user_id = v_user;
                if v_conversation is null then
                    return jsonb_build_object('error', 'conversation_not_found');
                end if;
                -- A conversation started empty takes its first message as its title.
                update public.conversations c
                   set title = left(regexp_replace(p_content, '\s+', ' ', 'g'), 60)
                 where c.id = v_conversation and c.user_id = v_user and c.surface = 'web' and c.title = '';
            end if;
        else
            select c.id into v_conversation
              from public.conversations c
             where c.user_id = v_user and c.surface = p_surface;
            if v_conversation is null then
                -- The unique partial index settles a race between two first messages.
                insert into public.conversations (user_id, surface, title)
                     values (v_user, p_surface, case p_surface when 'telegram' then '[Telegram]' else '[WhatsApp]' end)
                on conflict (user_id, surface) where surface <> 'web' do nothing;
                select c.id into v_conversation
                  from public.conversations c
                 where c.user_id = v_user and c.surface = p_surface;
            end if;
        end if;

        -- The key was looked up under its lock: this insert meets no other delivery of it.
        insert into public.messages (conversation_id, user_id, surface, role, content, external_id, attempt,
                                     answer_by, sender)
             values (v_conversation, v_user, p_surface, 'user', p_content, p_external_id, p_attempt,
                     v_now + make_interval(secs => p_answer_within_seconds), p_sender)
          returning id, created_at into v_message_id, v_message_at;

        if p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0 then
            insert into public.turn_usage (message_id, user_id, at) values (v_message_id, v_user, v_message_at);
        end if;
    end if;

    select c.surface into v_conversation_surface from public.conversations c where c.id = v_conversation;
    if p_surface = 'web' then
        v_history := public.context_window(v_user, v_conversation, '-infinity', v_message_at, v_message_id,
                                           p_max_messages, p_window_step);
        if v_conversation_surface = 'web' and p_web_prepend > 0 then
            select coalesce(jsonb_agg(to_jsonb(s) order by s.created_at, s.id), '[]'::jsonb) into v_prepend
              from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
                      from public.messages m
                      join public.conversations c on c.id = m.conversation_id
                     where m.user_id = v_user
                       and c.user_id = v_user
                       and c.surface <> 'web'
                       and m.created_at >= v_since
                       and (m.created_at, m.id) <= (v_message_at, v_message_id)
                     order by m.created_at desc, m.id desc
                     limit p_web_prepend) s;
        end if;
    else
        v_history := public.context_window(v_user, null, v_message_at - make_interval(hours => p_window_hours),
                                           v_message_at, v_message_id, p_max_messages, p_window_step);
    end if;

    return jsonb_build_object(
        'user_id', v_user, 'conversation_id', v_conversation,
        'conversation_surface', v_conversation_surface, 'message_id', v_message_id,
        'duplicate', false, 'owed', v_owed, 'attempt', p_attempt, 'reply', null, 'history', v_history, 'prepend', v_prepend,
        'notes', (select n.content from public.memory_notes n where n.user_id = v_user and n.revision > 0));
end;
$$;


-- As in 20261130145000_turn_budget.sql, with the turn's tokens added to what its earlier
-- attempts spent (an abandoned stream, a fallback), never written over them.
create or replace function public.finish_turn(
    p_user_id uuid,
    p_user_message_id bigint,
    p_content text,
    p_delivered boolean default true,
    p_tokens integer default 0
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_reply_id bigint;
    v_conversation uuid;
    v_owner uuid;
begin
    with asked as (
        select m.id, m.conversation_id, m.user_id, m.surface
          from public.messages m
         where m.id = p_user_message_id and m.role = 'user'
           and (m.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = m.user_id))
    ), stored as (
        insert into public.messages (conversation_id, user_id, surface, role, content, in_reply_to, delivered_at)
        select a.conversation_id, a.user_id, a.surface, 'assistant', p_content, a.id,
               case when p_delivered then clock_timestamp() end
          from asked a
        on conflict (in_reply_to) where in_reply_to is not null do nothing
        returning id, conversation_id, user_id
    )
    select s.id, s.conversation_id, s.user_id into v_reply_id, v_conversation, v_owner from stored s;

    if v_reply_id is not null then
        update public.conversations c
           set updated_at = clock_timestamp()
         where c.id = v_conversation and c.user_id = v_owner;
        update public.turn_usage u set tokens = u.tokens + greatest(p_tokens, 0)
         where u.message_id = p_user_message_id;
    else
        select r.id into v_reply_id
          from public.messages r
         where r.in_reply_to = p_user_message_id and r.content = p_content
           and (r.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = r.user_id));
    end if;
    return jsonb_build_object('reply_id', v_reply_id);
end;
$$;


-- A turn that ended without a stored reply (a fallback, an abandoned stream, an error after part
-- of an answer): what the model spent counts, and the message is owed from now on (unless a reply
-- was stored meanwhile, or another attempt took it over). Returns {"owed": boolean}.
create function public.end_attempt(p_user_id uuid, p_user_message_id bigint, p_attempt uuid, p_tokens integer)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_owed boolean;
begin
    update public.turn_usage u set tokens = u.tokens + greatest(p_tokens, 0)
     where u.message_id = p_user_message_id and u.user_id = p_user_id;
    update public.messages m set answer_by = clock_timestamp()
     where m.id = p_user_message_id and m.user_id = p_user_id and m.role = 'user'
       -- only while no later attempt has taken the message over: never two attempts at once
       and m.attempt is not distinct from p_attempt
       and not exists (select from public.messages r where r.in_reply_to = m.id);
    v_owed := found;
    return jsonb_build_object('owed', v_owed);
end;
$$;


-- The scheduled job's share of owed messages: Telegram's and WhatsApp's (p_surfaces, comma-separated) stored in
-- the last p_max_age_seconds with no reply and no attempt that may still answer. Each is taken
-- over (`for update skip locked`: overlapping runs share them out) and returned with the context
-- it is answered from, as begin_turn would have returned it.
create function public.claim_owed_replies(
    p_surfaces text,
    p_max_age_seconds integer,
    p_answer_within_seconds integer,
    p_limit integer,
    p_window_hours integer,
    p_max_messages integer,
    p_window_step integer
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_claimed jsonb := '[]'::jsonb;
    v_message record;
    v_attempt uuid;
begin
    for v_message in
        select m.id, m.user_id, m.conversation_id, m.surface, m.sender, m.created_at
          from public.messages m
         where m.role = 'user' and m.sender is not null
           and m.created_at > v_now - make_interval(secs => p_max_age_seconds)
           and m.surface = any (string_to_array(p_surfaces, ','))
           and (m.answer_by is null or m.answer_by <= v_now)
           and not exists (select from public.messages r where r.in_reply_to = m.id)
         order by m.created_at
         limit p_limit
           for update of m skip locked
    loop
        update public.messages m
           set answer_by = v_now + make_interval(secs => p_answer_within_seconds), attempt = gen_random_uuid()
         where m.id = v_message.id
        returning m.attempt into v_attempt;
        v_claimed := v_claimed || jsonb_build_object('attempt', v_attempt,
            'user_id', v_message.user_id, 'conversation_id', v_message.conversation_id,
            'conversation_surface', v_message.surface, 'message_id', v_message.id,
            'surface', v_message.surface, 'sender', v_message.sender, 'created_at', v_message.created_at,
            'duplicate', false, 'owed', true, 'reply', null, 'prepend', '[]'::jsonb,
            'history', public.context_window(v_message.user_id, null,
                                             v_message.created_at - make_interval(hours => p_window_hours),
                                             v_message.created_at, v_message.id, p_max_messages, p_window_step),
            'notes', (select n.content from public.memory_notes n
                       where n.user_id = v_message.user_id and n.revision > 0));
    end loop;
    return v_claimed;
end;
$$;


-- As in 20261130100000, with the account the code belongs to (masked, as the person's token
-- named it), so that the chat that redeems it can be told whose account it joins.
drop function public.create_link_code(uuid, text, integer);

create function public.create_link_code(p_user_id uuid, p_code_hash text, p_ttl_minutes integer, p_account text)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_expires timestamptz := clock_timestamp() + make_interval(mins => greatest(p_ttl_minutes, 1));
begin
    delete from public.link_codes c
     where c.user_id = p_user_id and (c.used_at is null or c.expires_at < clock_timestamp() - interval '1 day');
    insert into public.link_codes (code_hash, user_id, expires_at, account)
         values (p_code_hash, p_user_id, v_expires, coalesce(p_account, ''));
    return jsonb_build_object('expires_at', v_expires);
end;
$$;


-- As in 20261130105000_link_races.sql, with consent (4): without p_consented, a valid code on a
-- chat whose person has messages links nothing and spends nothing: it answers
-- {"status": "needs_consent", "account", "messages"}. Every answer names the code's account.
drop function public.redeem_link_code(text, text, text, integer);

create function public.redeem_link_code(
    p_surface text,
    p_external_id text,
    p_code_hash text,
    p_max_attempts integer,
    p_consented boolean
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_since timestamptz := clock_timestamp() - interval '1 hour';
    v_failures integer;
    v_first_failure timestamptz;
    v_code record;
    v_status text;
    v_messages integer;
begin
    -- One identity's attempts are counted one at a time, so two at once cannot both pass.
    perform pg_advisory_xact_lock(hashtextextended('link:' || p_surface || ':' || p_external_id, 0));
    select count(*), min(a.attempted_at) into v_failures, v_first_failure
      from public.link_attempts a
     where a.surface = p_surface and a.external_id = p_external_id and a.attempted_at > v_since;
    if p_max_attempts > 0 and v_failures >= p_max_attempts then
        return jsonb_build_object('status', 'too_many_attempts',
                                  'retry_at', v_first_failure + interval '1 hour');
    end if;

    -- The row lock makes the code single-use: of two identities racing, the second waits,
    -- then finds it used.
    select c.user_id, c.used_at, c.used_by_surface, c.used_by_external_id, c.expires_at, c.account into v_code
      from public.link_codes c where c.code_hash = p_code_hash
       for update;
    v_status := case when v_code.user_id is null then 'invalid'
                     when v_code.used_at is null and v_code.expires_at > clock_timestamp() then 'valid'
                     when v_code.used_at is null then 'expired'
                     when v_code.used_by_surface = p_surface and v_code.used_by_external_id = p_external_id
                          and exists (select from public.identities i
                                       where i.surface = p_surface and i.external_id = p_external_id
                                         and i.user_id = v_code.user_id) then 'already_linked'
                     else 'used' end;
    if v_status = 'already_linked' then
        -- The same identity again (a redelivered /start): it is linked, say so again.
        return jsonb_build_object('status', 'already_linked', 'user_id', v_code.user_id, 'moved_messages', 0,
                                  'account', v_code.account);
    end if;
    if v_status <> 'valid' then
        insert into public.link_attempts (surface, external_id) values (p_surface, p_external_id);
        delete from public.link_attempts a where a.attempted_at < clock_timestamp() - interval '1 day';
        return jsonb_build_object('status', v_status);
    end if;
    if exists (select from public.identities i
                where i.surface = p_surface and i.external_id = p_external_id
                  and i.linked_at is not null and i.user_id <> v_code.user_id) then
        return jsonb_build_object('status', 'linked_elsewhere');
    end if;
    if not p_consented then
        select count(*) into v_messages
          from public.messages m
          join public.identities i on i.user_id = m.user_id
         where i.surface = p_surface and i.external_id = p_external_id and i.user_id <> v_code.user_id;
        if v_messages > 0 then
            return jsonb_build_object('status', 'needs_consent', 'account', v_code.account, 'messages', v_messages);
        end if;
    end if;
    update public.link_codes c
       set used_at = clock_timestamp(), used_by_surface = p_surface, used_by_external_id = p_external_id
     where c.code_hash = p_code_hash;
    return public.link_identity(v_code.user_id, p_surface, p_external_id) || jsonb_build_object('account', v_code.account);
end;
$$;


-- As in 20261130170000_forget_notes.sql, except that a conversation the person does not have
-- forgets nothing: no notes, no deliveries (a frontend that deletes twice keeps the notes).
create or replace function public.forget_conversations(p_user_id uuid, p_conversation_id uuid default null)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_messages integer;
    v_conversations integer;
begin
    if p_conversation_id is not null and not exists (
        select from public.conversations c where c.id = p_conversation_id and c.user_id = p_user_id) then
        return jsonb_build_object('messages', 0, 'conversations', 0);
    end if;
    delete from public.forgotten_deliveries f where f.forgotten_at < clock_timestamp() - interval '2 days';
    insert into public.forgotten_deliveries (surface, external_id, user_id)
    select m.surface, m.external_id, m.user_id
      from public.messages m
     where m.user_id = p_user_id
       and (p_conversation_id is null or m.conversation_id = p_conversation_id)
       and m.external_id is not null
       and m.created_at > clock_timestamp() - interval '2 days'
    on conflict do nothing;

    delete from public.messages m
     where m.user_id = p_user_id
       and (p_conversation_id is null or m.conversation_id = p_conversation_id);
    get diagnostics v_messages = row_count;
    delete from public.conversations c
     where c.user_id = p_user_id
       and (p_conversation_id is null or c.id = p_conversation_id);
    get diagnostics v_conversations = row_count;
    -- The notes were written from these messages: they go too, and the next digest writes
    -- them again from whatever remains.
    delete from public.memory_notes n where n.user_id = p_user_id;
    return jsonb_build_object('messages', v_messages, 'conversations', v_conversations);
end;
$$;


-- As in 20261130150000_memory_notes.sql, with the joined notes cut to the table's limit (the
-- merged person's part, which comes last, is cut): two full notes never fail a link. The next
-- digest folds them into one within MEMORY_NOTES_MAX_TOKENS.
create or replace function public.fold_memory_notes(p_from uuid, p_into uuid) returns void
language plpgsql
set search_path = ''
as $$
declare
    v_from public.memory_notes;
begin
    delete from public.memory_notes n where n.user_id = p_from returning n.* into v_from;
    update public.memory_notes n
       set content = left(concat_ws(E'\n', nullif(n.content, ''), nullif(v_from.content, '')), 64000),
           covered_until_at = case
               when v_from.covered_until_id is null then null
               when (v_from.covered_until_at, v_from.covered_until_id) < (n.covered_until_at, n.covered_until_id)
               then v_from.covered_until_at
               else n.covered_until_at end,
           covered_until_id = case
               when v_from.covered_until_id is null then null
               when (v_from.covered_until_at, v_from.covered_until_id) < (n.covered_until_at, n.covered_until_id)
               then v_from.covered_until_id
               else n.covered_until_id end,
           pending_fold = true
     where n.user_id = p_into and n.revision > 0;
    if not found and v_from.revision > 0 then
        insert into public.memory_notes (user_id, content, revision, written_at, pending_fold)
             values (p_into, v_from.content, 1, v_from.written_at, true)
        on conflict (user_id) do update
            set content = excluded.content, revision = 1, written_at = excluded.written_at, pending_fold = true;
    end if;
end;
$$;


revoke all on function
    public.begin_turn(text, text, text, uuid, text, uuid, integer, integer, integer, integer, uuid, integer, integer,
                      integer, integer, text),
    public.end_attempt(uuid, bigint, uuid, integer),
    public.claim_owed_replies(text, integer, integer, integer, integer, integer, integer),
    public.create_link_code(uuid, text, integer, text),
    public.redeem_link_code(text, text, text, integer, boolean)
from public, anon, authenticated;
grant execute on function
    public.begin_turn(text, text, text, uuid, text, uuid, integer, integer, integer, integer, uuid, integer, integer,
                      integer, integer, text),
    public.end_attempt(uuid, bigint, uuid, integer),
    public.claim_owed_replies(text, integer, integer, integer, integer, integer, integer),
    public.create_link_code(uuid, text, integer, text),
    public.redeem_link_code(text, text, text, integer, boolean)
to service_role;
