-- Forgetting and retention: a person erases their memory from whichever app they are in; an
-- operator erases a person, or purges messages by age.
--
-- Tables: forget_requests (a pending `/forget`, which deletes nothing until confirmed within
-- minutes) and forgotten_deliveries (the delivery ids of messages forgotten in the last two days:
-- Telegram keeps an unacknowledged update for a day, so a redelivery may arrive after the
-- forget; begin_turn answers it like a duplicate). Neither holds any text.
-- Forgetting reaches what was derived from the messages: the memory notes go with them, and
-- the operator's erasure also takes the budget's counts (turn_usage and voice_usage, which a
-- plain forget keeps a day so it gives no turns back).

create table public.forget_requests (
    user_id uuid not null,
    surface public.chat_surface not null,
    requested_at timestamptz not null default clock_timestamp(),
    -- On a surface whose sender the platform does not vouch for (SMS's caller ID can be forged),
    -- the code the request's answer sent to that number, which the confirmation must repeat, and
    -- the number it was sent to, the only one that may repeat it.
    code text,
    sender text,
    primary key (user_id, surface)
);
alter table public.forget_requests enable row level security;  -- who reads what: access.sql

create table public.forgotten_deliveries (
    surface public.surface not null,
    external_id text not null,
    user_id uuid not null,
    forgotten_at timestamptz not null default clock_timestamp(),
    primary key (surface, external_id, user_id)
);
alter table public.forgotten_deliveries enable row level security;  -- who reads what: access.sql
create index forgotten_deliveries_by_age on public.forgotten_deliveries (forgotten_at);


-- Delete a person's conversations (one, or all of them), their messages and their memory notes.
-- The delivery ids of the recent ones are kept for two days, so that a webhook delivered again
-- cannot store them anew. A conversation the person does not have forgets nothing: no notes,
-- no deliveries (a frontend that deletes twice keeps the notes).
-- Returns {"messages", "conversations"}: 0 conversations for someone else's or a missing id.
create or replace function public.forget_conversations(p_user_id uuid, p_conversation_id uuid)
    returns jsonb language plpgsql set search_path = '' as $$
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
    -- them again from whatever remains; a digest claiming them now loses its claim.
    perform crossmem_private.await_notes_claim(p_user_id);
    delete from public.memory_notes n where n.user_id = p_user_id;
    return jsonb_build_object('messages', v_messages, 'conversations', v_conversations);
end;
$$;

-- Everything of a person: every conversation and message on every surface, their notes, their
-- language and time zone, link codes and pending forget requests. Their identities stay (the apps
-- are still one person, who starts from nothing) unless p_erase_identities: the operator's erasure,
-- which also removes the identities, their wrong-code attempts, their ids in the codes they
-- redeemed, who they were merged from, and their budget's counts.
-- Returns {"messages", "conversations", "link_codes", "identities"}.
create or replace function public.forget_person(p_user_id uuid, p_erase_identities boolean)
    returns jsonb language plpgsql set search_path = '' as $$
declare
    v_forgotten jsonb := public.forget_conversations(p_user_id, null);
    v_codes integer;
    v_identities integer := 0;
begin
    delete from public.link_codes c where c.user_id = p_user_id;
    get diagnostics v_codes = row_count;
    delete from public.forget_requests r where r.user_id = p_user_id;
    -- Learned from what they said or sent (a voice note's): gone with it; their app says it again.
    delete from public.person_languages l where l.user_id = p_user_id;
    -- Where they live, so too (what they said, or their browser's, which says it again).
    delete from public.person_timezones t where t.user_id = p_user_id;
    if p_erase_identities then
        update public.link_codes c
           set used_by_external_id = null
          from public.identities i
         where i.user_id = p_user_id
           and c.used_by_surface = i.surface and c.used_by_external_id = i.external_id;
        delete from public.link_attempts a
         using public.identities i
         where i.user_id = p_user_id and a.surface = i.surface and a.external_id = i.external_id;
        delete from public.identities i where i.user_id = p_user_id;
        get diagnostics v_identities = row_count;
        delete from public.merged_people x where x.from_user_id = p_user_id or x.into_user_id = p_user_id;
        delete from public.turn_usage u where u.user_id = p_user_id;
        delete from public.voice_usage v where v.user_id = p_user_id;
    end if;
    return v_forgotten || jsonb_build_object('link_codes', v_codes, 'identities', v_identities);
end;
$$;

-- `/forget` (p_confirm false) and `/forget confirm` (true) from a Telegram chat or WhatsApp number:
-- the person is p_user_id (the owner policy) or the identity's. A request is remembered per person
-- and surface; a confirmation within p_window_minutes of it forgets the person (forget_person).
-- Returns {"status": "requested"|"forgotten"|"no_request"|"expired"|"wrong_code"|"too_many_attempts"|"unknown", "messages",
-- "conversations", "language"}: the counts that will be deleted (requested, with "follow_ups": the
-- pending ones it cancels) or were (forgotten),
-- and the person's language as it was before (forgetting deletes it), which the answer is said in.
-- p_sender_id is the sender's key (under the owner policy too); p_sender_alias its other id (a
-- WhatsApp number beside its BSUID): a sender id never seen is the person the turn would join it
-- to (identities.sql's alias_identity), whose thread its next message reads. p_code: on a request, the code its
-- answer sends (null: none asked); on a confirmation, the code it repeats. A request with a code
-- is confirmed only with that code, from the number it was sent to; any other confirmation ends
-- the request ("wrong_code") and counts as the confirming sender's wrong code (link_attempts, as a
-- wrong link code does, under the same lock), so a forger guesses once for each request the holder
-- is sent, and past p_max_attempts wrong codes in an hour (0: no limit) that sender's requests are
-- not taken ("too_many_attempts", "retry_at").
create or replace function public.forget_request(
    p_surface text,
    p_confirm boolean,
    p_user_id uuid,
    p_sender_id text,
    p_window_minutes integer,
    p_code text,
    p_max_attempts integer,
    p_sender_alias text
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_user uuid := p_user_id;
    v_requested_at timestamptz;
    v_code text;
    v_sender text;
    v_retry_at timestamptz;
    v_language jsonb;
begin
    if v_user is null then
        select i.user_id into v_user
          from public.identities i
         where i.surface = p_surface and i.external_id = p_sender_id;
    end if;
    if v_user is null then
        v_user := (crossmem_private.alias_identity(p_surface, p_sender_id, p_sender_alias)).user_id;
    end if;
    if v_user is null then
        -- A sender who never wrote: nothing of theirs is stored, nothing to remember.
        return jsonb_build_object('status', 'unknown', 'messages', 0, 'conversations', 0);
    end if;
    v_language := jsonb_build_object('language', public.person_language(v_user, null, null));

    -- One sender's requests and confirmations one at a time, with its link codes (links.sql).
    v_retry_at := crossmem_private.wrong_codes_retry_at(p_surface, p_sender_id, p_max_attempts);
    if not p_confirm and p_code is not null and v_retry_at is not null then
        return jsonb_build_object('status', 'too_many_attempts', 'retry_at', v_retry_at,
                                  'messages', 0, 'conversations', 0) || v_language;
    end if;
    if not p_confirm then
        -- Requests nobody confirmed are kept a day at most (they say who considered forgetting).
        delete from public.forget_requests r where r.requested_at < clock_timestamp() - interval '1 day';
        insert into public.forget_requests (user_id, surface, code, sender)
             values (v_user, p_surface, p_code, case when p_code is not null then p_sender_id end)
        on conflict (user_id, surface) do update
            set requested_at = excluded.requested_at, code = excluded.code, sender = excluded.sender;
        return jsonb_build_object(
            'status', 'requested',
            'messages', (select count(*) from public.messages m where m.user_id = v_user),
            'conversations', (select count(*) from public.conversations c where c.user_id = v_user),
            -- the reminders they wait for, which go with their conversations (follow_ups.sql)
            'follow_ups', (select count(*) from public.follow_ups f
                            where f.user_id = v_user and f.status in ('pending', 'held'))) || v_language;
    end if;

    delete from public.forget_requests r
     where r.user_id = v_user and r.surface = p_surface
    returning r.requested_at, r.code, r.sender into v_requested_at, v_code, v_sender;
    if v_requested_at is null then
        return jsonb_build_object('status', 'no_request', 'messages', 0, 'conversations', 0) || v_language;
    end if;
    if v_code is not null and (p_code is distinct from v_code or p_sender_id is distinct from v_sender) then
        perform crossmem_private.count_wrong_code(p_surface, p_sender_id, null);
        return jsonb_build_object('status', 'wrong_code', 'messages', 0, 'conversations', 0) || v_language;
    end if;
    if v_requested_at < clock_timestamp() - make_interval(mins => p_window_minutes) then
        return jsonb_build_object('status', 'expired', 'messages', 0, 'conversations', 0) || v_language;
    end if;
    return jsonb_build_object('status', 'forgotten') || public.forget_person(v_user, false) || v_language;
end;
$$;

-- One batch of the purge by age: at most p_limit messages older than p_older_than_seconds
-- (p_limit null: no limit), in one statement; the caller loops, each call its own transaction,
-- passing back where the previous batch stopped (p_below_at, p_below_id), so that no batch
-- scans the rows its predecessors deleted.
-- A turn goes whole: a message whose reply is younger than the age waits for it. A turn in
-- flight is never touched: a message without a reply is kept for p_in_flight_seconds (the
-- longest model deadline and then some), while its reply may still be written.
-- The memory notes' lines about what the purge deletes go too (memory_notes.sql's
-- purge_note_lines: a line once its day is over everywhere before the cutoff), in the same batch
-- and transaction: the notes of at most p_limit / 40 people, since rewriting one person's (some
-- thirty lines, read twice and written again: 0.5 ms) costs about what deleting a dozen or more
-- messages does, and a batch's statements stay short. The caller loops until a batch deletes
-- nothing and rewrites no notes.
-- p_dry_run counts and deletes nothing.
-- Returns {"cutoff", "candidates", "deleted", "below_at", "below_id", "notes"}: "notes", the people
-- whose notes lost lines (would lose them).
create or replace function public.purge_messages(
    p_older_than_seconds bigint,
    p_in_flight_seconds integer,
    p_limit integer,
    p_dry_run boolean,
    p_below_at timestamptz,
    p_below_id bigint
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_cutoff timestamptz := clock_timestamp() - make_interval(secs => p_older_than_seconds);
    v_in_flight_since timestamptz := clock_timestamp() - make_interval(secs => p_in_flight_seconds);
    -- Where this batch starts, as one row comparison, so that messages_by_age's scan starts
    -- there: below the previous batch, or below the cutoff (ids start at 1).
    v_from_at timestamptz := least(p_below_at, v_cutoff);
    v_from_id bigint := case when p_below_at < v_cutoff then p_below_id else 0 end;
    v_result jsonb;
    v_conversations uuid[];
begin
    with candidates as (
        select m.ctid, m.created_at, m.id
          from public.messages m
         where (m.created_at, m.id) < (v_from_at, v_from_id)
           and (m.role = 'assistant'
                or coalesce((select r.created_at < v_cutoff from public.messages r where r.in_reply_to = m.id),
                            m.created_at < v_in_flight_since))
         -- Newest first: a reply is deleted in its message's batch or an earlier one, so the
         -- cascade from a message to its reply never touches a row beyond the batch's limit.
         order by m.created_at desc, m.id desc
         limit p_limit
    ), deleted as (
        -- By ctid, read in this same statement: no second index lookup per row. A row updated
        -- meanwhile has moved and is left for the next purge.
        delete from public.messages m
         using candidates c
         where m.ctid = c.ctid and not p_dry_run
        returning m.conversation_id
    ), last as (
        select c.created_at, c.id from candidates c order by c.created_at, c.id limit 1
    )
    select jsonb_build_object(
               'cutoff', v_cutoff,
               'candidates', (select count(*) from candidates),
               'deleted', (select count(*) from deleted),
               'below_at', (select l.created_at from last l),
               'below_id', (select l.id from last l)),
           (select array_agg(distinct d.conversation_id) from deleted d)
      into v_result, v_conversations;
    -- after the delete and its foreign keys' actions (messages, then conversations, as a turn)
    update public.conversations c set counted = null, counted_at = null, counted_id = null
     where c.id = any(v_conversations) and c.counted is not null;
    return v_result || jsonb_build_object(
        'notes', crossmem_private.purge_note_lines(v_cutoff, ceil(p_limit / 40.0)::integer, p_dry_run));
end;
$$;
