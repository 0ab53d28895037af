-- Follow-ups the agent starts (issue #21): "remind me on Friday at 9", delivered once, on the
-- app the person uses.
--
-- 1. `follow_ups`: what the model scheduled through its tools, due at a UTC time, to be said in
--    the conversation it was asked in (the chat or number kept in `sender`). Pending until the
--    scheduled job claims it (`claim_due_follow_ups`, `for update skip locked`: overlapping runs
--    share them out), `sending` while one run delivers it, then `sent` (stored in the thread as
--    the agent's message), `pending` again with a later `next_attempt_at` (a failure that may
--    pass), `held` (WhatsApp outside its 24-hour window without a template: delivered first on
--    the person's next WhatsApp message; or due to an SMS number that opted out, with no other app
--    to move to: let go by its opt-in, let_go_after_opt_in, given up by the job's claim once its
--    `held_until` has passed with none) or `given_up`. A run whose time budget ends before it
--    tries some of its claimed rows hands them back, pending (`release_follow_ups`). A run marks
--    each row just before it sends it (`try_follow_up`): of a run that never came back, the rows
--    it tried are given up, never sent again (a follow-up goes out at most once), and the ones it
--    never reached go back to pending (a claim outlasts any live run: the job's lease is at least
--    its function's timeout).
-- 2. A person's timezone (`person_timezones`): "Friday at 9" is resolved in it by the turn; and
--    their language (`person_languages`), which the fixed phrases are said in.
-- 3. The two round trips of a turn stay two: begin_turn (turn.sql) answers with what follow-ups
--    need (`turn_follow_ups`, one of its parts), and `finish_turn_follow_ups` calls finish_turn
--    and adds, in the same round trip, what the model's tools decided; a turn whose tools
--    changed nothing calls finish_turn alone.
-- 4. Forgetting deletes them (they go with the conversation they were asked in); a link moves
--    them with the conversation's messages; unlinking keeps them with the person who asked.

create table public.follow_ups (
    id bigint generated always as identity primary key,
    user_id uuid not null,
    conversation_id uuid not null references public.conversations (id) on delete cascade,
    surface public.surface not null,
    -- The chat id or WhatsApp address to say it to (null on the web).
    sender text,
    -- The app it was going to before it moved (move_follow_up, core/follow_ups/moves.py): 'web' for
    -- one asked there and said on the app the person last wrote from; the app that refused it for
    -- good for one moved on from there, which moves no further. Null: said where it was asked.
    moved_from public.surface,
    -- The user message it was asked in, and its place among that turn's follow-ups: a retried
    -- finish_turn_follow_ups schedules nothing twice.
    asked_in bigint,
    asked_order integer not null default 0,
    content text not null check (char_length(content) between 1 and 200000),
    due_at timestamptz not null,
    timezone text not null default 'UTC',
    -- `reserved`: its place among the person's FOLLOW_UPS_PER_PERSON taken by the schedule tool of a
    -- turn still running (reserve_follow_up), until claimed_until; pending once the turn's reply is
    -- stored (finish_turn_follow_ups), gone with an attempt that ends without one (end_attempt).
    status text not null default 'pending'
        check (status in ('reserved', 'pending', 'sending', 'held', 'sent', 'given_up')),
    attempts integer not null default 0,
    next_attempt_at timestamptz not null,
    claimed_until timestamptz,
    -- The claim (one per claim_due_follow_ups call) that holds it, or last held it: its outcome is
    -- recorded, and it is handed back, only under that claim, so a retried call of the run that
    -- claimed it knows its own work and never touches a later run's claim.
    claim uuid,
    -- (claimed_until: for a `reserved` one, when its place is no longer held: a turn that died.)
    -- When its claim's run began to send it (try_follow_up); null while claimed and not yet tried.
    tried_at timestamptz,
    -- Said in parts (past a surface's limit), a later one refused for a reason that may pass: its
    -- first part not sent, which the retry starts from (the person has the ones before it).
    unsent_from smallint check (unsent_from >= 0),
    -- By SMS, what those first parts were cut from as the person reads it (the text, and when said
    -- late the note of when it was due: core/follow_ups/lateness.py): the retry says the rest of
    -- it, so a note first added, or said anew, at a later try never renumbers the parts ("(1/2)"
    -- then "(2/3)").
    said_as text,
    -- Held for its chat or number's opt-in (finish_follow_up's 'opted_out'): until when, a week
    -- after it was due (core/follow_ups/opted_out.py); past it with no opt-in, the job's claim gives
    -- it up. Null for a hold of another kind (WhatsApp's window), which has no end. Read only while
    -- `held`: every hold sets it anew.
    held_until timestamptz,
    message_id bigint references public.messages (id) on delete set null,
    -- Held, then said first in the answer to this user message: every answer to it (a redelivery's,
    -- the scheduled job's, a later attempt's) says it again, until one reaches the person.
    said_with bigint references public.messages (id) on delete set null,
    created_at timestamptz not null default clock_timestamp(),
    sent_at timestamptz,
    constraint follow_ups_once_per_turn unique (asked_in, asked_order)
);
alter table public.follow_ups enable row level security;  -- who reads what: access.sql
-- What the job scans: the due ones, oldest first (an index of pending rows only).
create index follow_ups_due on public.follow_ups (next_attempt_at) where status = 'pending';
create index follow_ups_sending on public.follow_ups (claimed_until) where status = 'sending';
-- The holds for an opt-in whose week has passed, which the claim gives up: found without reading
-- the pending ones nor the holds that have no end.
create index follow_ups_held_until on public.follow_ups (held_until) where status = 'held' and held_until is not null;
create index follow_ups_by_user on public.follow_ups (user_id, due_at) where status in ('pending', 'sending', 'held');
create index follow_ups_by_conversation on public.follow_ups (conversation_id);
create index follow_ups_reserved on public.follow_ups (user_id) where status = 'reserved';
create index follow_ups_said_with on public.follow_ups (said_with) where said_with is not null;
create index follow_ups_said_by_user on public.follow_ups (user_id) where said_with is not null;
-- Deleting a message (a purge, forgetting) sets the follow-ups stored as it to null: found by this.
create index follow_ups_by_message on public.follow_ups (message_id) where message_id is not null;

-- `stated`: the person said it (the model's set_timezone), not a web browser (its Intl zone, which
-- says UTC under Firefox's resistFingerprinting, or a trip's zone): a browser's zone replaces only
-- another a browser sent, and a stated one is changed only by stating another.
create table public.person_timezones (
    user_id uuid primary key,
    timezone text not null check (char_length(timezone) between 1 and 64),
    stated boolean not null default false,
    updated_at timestamptz not null default clock_timestamp()
);
alter table public.person_timezones enable row level security;  -- who reads what: access.sql

-- A person's language (docs/decisions.md, "The person's language"): the primary tag of what a
-- request last stated (Telegram's language_code, the web's navigator.language), or of what the
-- transcription service last heard when nothing was stated. begin_turn keeps it and answers it
-- (turn.sql), so a WhatsApp "ok" after Spanish on Telegram is answered in Spanish. Beside the
-- timezone: the same owner, the same fate when forgotten (forgetting.sql) or merged (links.sql).
create table public.person_languages (
    user_id uuid primary key,
    language text not null check (language ~ '^[a-z]{2,3}$'),
    updated_at timestamptz not null default clock_timestamp()
);
alter table public.person_languages enable row level security;  -- who reads what: access.sql

-- The person's language, after keeping p_language (a primary tag, or null: nothing learned) as
-- theirs, or as that of the person they have since been merged into (a turn's end may come after
-- a link). Written only when it differs: the same language again is a read, and takes no lock
-- that would make the person's turns wait for each other. Both read in one statement: each
-- turn calls it twice (begin_turn, finish_turn).
create function crossmem_private.remember_language(p_user_id uuid, p_language text, p_message_id bigint)
    returns text language plpgsql set search_path = '' as $$
declare
    v_user uuid;
    v_language text;
begin
    select v.user_id, l.language into v_user, v_language
      from (select coalesce((select x.into_user_id from public.merged_people x where x.from_user_id = p_user_id),
                            p_user_id) as user_id) v
      left join public.person_languages l on l.user_id = v.user_id;
    if p_language is null or v_language is not distinct from p_language then
        return v_language;
    end if;
    -- Learned from a stored message (a turn's end, p_message_id): not kept once a forget took the
    -- message (forgetting.sql deleted the language with it). Asked only when there is something to
    -- write: a turn that learned nothing new reads nothing more.
    if p_message_id is not null
       and not exists (select from public.messages m where m.id = p_message_id and m.user_id = v_user) then
        return v_language;
    end if;
    insert into public.person_languages (user_id, language) values (v_user, p_language)
    on conflict (user_id) do update set language = excluded.language, updated_at = clock_timestamp();
    return p_language;
end;
$$;



-- A link moves a conversation (its owner changes) or its messages (into the person's own
-- conversation of that surface, and the emptied one is deleted): the follow-ups go with them.
create function public.follow_ups_follow_their_thread() returns trigger language plpgsql set search_path = '' as $$
begin
    if tg_table_name = 'conversations' then
        update public.follow_ups f set user_id = new.user_id where f.conversation_id = new.id;
    else
        update public.follow_ups f set conversation_id = new.conversation_id, user_id = new.user_id
         where f.conversation_id = old.conversation_id;
    end if;
    return null;
end;
$$;
create trigger follow_ups_follow_their_conversation
    after update of user_id on public.conversations
    for each row when (old.user_id is distinct from new.user_id)
    execute function public.follow_ups_follow_their_thread();
create trigger follow_ups_follow_their_messages
    after update of conversation_id on public.messages
    for each row when (old.conversation_id is distinct from new.conversation_id)
    execute function public.follow_ups_follow_their_thread();


-- A person's pending follow-ups (pending, being sent, held), soonest first. plpgsql: every turn
-- reads it (turn_follow_ups), and its plan is then kept for the session.
create function public.follow_ups_of(p_user_id uuid) returns json
language plpgsql
stable
set search_path = ''
as $$
begin
    return (select coalesce(json_agg(json_build_object(
                       'id', f.id, 'content', f.content, 'due_at', f.due_at, 'timezone', f.timezone,
                       'surface', f.surface, 'status', f.status, 'conversation_id', f.conversation_id)
                     order by f.due_at, f.id), '[]'::json)
              from public.follow_ups f
             where f.user_id = p_user_id and f.status in ('pending', 'sending', 'held'));
end;
$$;


-- The follow-ups said first in the answer to a WhatsApp message (`said_with`), in the order they
-- were due: what every answer to that message carries before its reply, with when each was due
-- and in which timezone (one said late says so: core/follow_ups/lateness.py).
create function crossmem_private.follow_ups_said_with(p_message_id bigint)
    returns json language sql stable set search_path = '' as $$
    select coalesce(json_agg(json_build_object('id', f.id, 'content', f.content, 'unsent_from', f.unsent_from,
                                               'due_at', f.due_at, 'timezone', f.timezone)
                             order by f.due_at, f.id), '[]'::json)
      from public.follow_ups f
     where f.said_with = p_message_id;
$$;

-- begin_turn's part for follow-ups, once the message (p_message_id) is stored or taken over:
-- `pending` (the person's pending ones, for the model's list and cancel tools and the limit),
-- `timezone` (theirs, null when never set) and `timezone_stated` (whether they said it: a browser's
-- zone does not replace it), and on WhatsApp `delivered_first` (the ones held
-- outside the 24-hour window: the person has just written, so they go out first in the answer to
-- this message, stored in the thread as the agent's messages; with those an earlier attempt at
-- this message took, so an answer that never arrived loses none of them; and with those an
-- earlier message of theirs took that no answer said: no reply to it, and no attempt holding it
-- (its tries failed; past OWED_REPLY_MAX_AGE the job no longer answers it), each from the part
-- its push got to. That message's row is locked first, skipped when another holds it (the job's
-- claim, a redelivery, forgetting: it keeps them), so a claim after this finds none left to say;
-- no wait, so no lock order to keep with them). A TwiML answer with no room for some of them
-- leaves those to the follow-up job (send_follow_ups_later, below). On the web, or on another app
-- while one asked on the web is pending, `apps` (else empty): the person's apps a follow-up asked
-- there would be pushed on, the one they last wrote from first (follow_up_apps, below), for the
-- schedule tool to say where it will reach them, and the list where a pending one will.
create function crossmem_private.turn_follow_ups(
    p_user_id uuid, p_surface text, p_message_id bigint, out pending json, out timezone text,
    out timezone_stated boolean, out delivered_first json, out apps json
) language plpgsql set search_path = '' as $$
declare
    v_held record;
    v_message bigint;
    v_unsaid bigint;
begin
    delivered_first := '[]'::json;
    if public.surface_has_window(p_surface) then
        for v_unsaid in
            select m.id from public.messages m
             where m.user_id = p_user_id and m.id <> p_message_id and m.answer_by < clock_timestamp()
               and m.id in (select f.said_with from public.follow_ups f
                             where f.user_id = p_user_id and f.said_with is not null)
               and not exists (select from public.messages r where r.in_reply_to = m.id)
               for no key update of m skip locked
        loop
            update public.follow_ups f set said_with = p_message_id
             where f.said_with = v_unsaid and f.user_id = p_user_id;
        end loop;
        for v_held in
            -- WhatsApp's own: one held for an SMS number's START waits for it (opted_out.py)
            select f.id, f.content, f.conversation_id, f.user_id
              from public.follow_ups f
             where f.user_id = p_user_id and f.status = 'held' and f.surface = p_surface
             order by f.due_at, f.id
               for update skip locked
        loop
            insert into public.messages (conversation_id, user_id, surface, role, content, delivered_at)
                 values (v_held.conversation_id, v_held.user_id, p_surface, 'assistant', v_held.content,
                         clock_timestamp())
              returning id into v_message;
            update public.follow_ups f
               set status = 'sent', sent_at = clock_timestamp(), message_id = v_message, said_with = p_message_id
             where f.id = v_held.id;
        end loop;
        delivered_first := crossmem_private.follow_ups_said_with(p_message_id);
    end if;
    pending := public.follow_ups_of(p_user_id);
    -- read from the pending ones just read (no second probe of follow_ups on every turn)
    apps := case when p_surface = 'web' or exists (
                          select from json_array_elements(pending) e
                           where e->>'surface' = 'web' and e->>'status' in ('pending', 'held'))
                 then crossmem_private.follow_up_apps(p_user_id, 'web') else '[]'::json end;
    select t.timezone, t.stated into timezone, timezone_stated from public.person_timezones t
     where t.user_id = p_user_id;
    timezone_stated := coalesce(timezone_stated, false);
end;
$$;


-- A WhatsApp message of the person's that is no message of the thread (a chat command, a notice:
-- an empty message, a place without coordinates; words past the day's budget). Nothing of it is
-- stored, yet for WhatsApp it is a message like any other: it opens the 24-hour window for the
-- number that wrote it. Kept on the person's conversation there (conversations.sql's
-- `unstored_message_at`, `unstored_message_from`), which claim_due_follow_ups reads beside their
-- last stored message: a reminder due inside that window goes free-form, to that number (a person
-- with two numbers may have written last in the thread from the other, whose window is closed). A
-- message of the thread is its own record: a turn never calls this. With p_let_go_held (a link, a
-- code mistyped, a notice, words over budget) their held reminders are let go too: no answer to
-- such a message is stored, so it cannot say them first as a turn's does (no message for
-- `said_with`); pending again at once, the follow-up job's next run says them in that window.
-- Never on forgetting (its question, or its confirmation, which deletes them) nor unlinking (they
-- stay with the person who asked, off this number). Called after the command is answered: a
-- forget that deleted the conversation, or an unlink that took the number away, leaves nothing to
-- record it on. The person: p_user_id (the owner), else whose p_sender is on p_surface.
-- {"released": n}.
create function public.wrote_outside_thread(p_user_id uuid, p_surface text, p_sender text, p_let_go_held boolean)
    returns jsonb language plpgsql set search_path = '' as $$
declare
    v_user uuid := coalesce(p_user_id, (select i.user_id from public.identities i
                                          where i.surface = p_surface and i.external_id = p_sender));
    v_released integer := 0;
begin
    update public.conversations c set unstored_message_at = clock_timestamp(), unstored_message_from = p_sender
     where c.user_id = v_user and c.surface = p_surface;
    if p_let_go_held then
        update public.follow_ups f set status = 'pending', next_attempt_at = clock_timestamp()
         where f.user_id = v_user and f.surface = p_surface and f.status = 'held';
        get diagnostics v_released = row_count;
    end if;
    return jsonb_build_object('released', v_released);
end;
$$;


-- A follow-up given up after its first parts reached the person (`unsent_from` past 0): kept in its
-- conversation as the agent's message, whole and undelivered, as a reply given up is, so that the
-- thread holds what the person was told and the agent knows it said it. Called where it is given
-- up: finish_follow_up, and a hold for an opt-in whose week passed (claim_due_follow_ups,
-- let_go_after_opt_in), whose first parts went before the STOP. Its message's id; null, and
-- nothing stored, when nothing of it went out.
create function crossmem_private.kept_in_thread(p_follow_up public.follow_ups) returns bigint
    language plpgsql set search_path = '' as $$
declare
    v_message bigint;
begin
    if coalesce(p_follow_up.unsent_from, 0) = 0 then
        return null;
    end if;
    insert into public.messages (conversation_id, user_id, surface, role, content)
         values (p_follow_up.conversation_id, p_follow_up.user_id, p_follow_up.surface, 'assistant',
                 p_follow_up.content)
      returning id into v_message;
    update public.conversations c set updated_at = clock_timestamp() where c.id = p_follow_up.conversation_id;
    return v_message;
end;
$$;

-- A person's chat or number on p_surface opted in again (record_opt_out, identities.sql: an SMS
-- number's START, UNSTOP or YES after STOP): the follow-ups held there because it had opted out
-- (finish_follow_up's 'opted_out') are let go. Still within their hold at p_now (the job's clock:
-- `held_until`, which the job recorded when it held them, core/follow_ups/opted_out.py, and which
-- the claim gives them up by), pending again, due as they were (their claim left next_attempt_at
-- past): the follow-up job's next run says them, late, with when they were due
-- (core/follow_ups/lateness.py), through the Messages API. Past it, given up unsaid: a reminder of
-- days gone (one whose first parts went out kept in its thread: kept_in_thread). Only p_user_id's;
-- on a surface with no window, `held` is only ever an opt-out's. {released, given_up}.
create function crossmem_private.let_go_after_opt_in(
    p_user_id uuid, p_surface text, p_now timestamptz, out released integer, out given_up integer
) language plpgsql set search_path = '' as $$
begin
    with let_go as (
        update public.follow_ups f
           set status = case when f.held_until >= p_now then 'pending' else 'given_up' end,
               message_id = case when f.held_until >= p_now then f.message_id
                                 else crossmem_private.kept_in_thread(f) end
         where f.user_id = p_user_id and f.surface = p_surface and f.status = 'held'
        returning f.status
    )
    select count(*) filter (where l.status = 'pending'), count(*) filter (where l.status = 'given_up')
      into released, given_up
      from let_go l;
end;
$$;


-- The follow-ups a WhatsApp message took to say first (p_ids, a JSON array) for which its TwiML
-- answer had no room (called by finish_turn_follow_ups, in the round trip that stores the answer): Twilio sends at most 10 messages in answer to one (its error 14109), and a
-- long reply with many follow-ups before it would pass that (core/surfaces/twilio_inbound.py). The
-- person has just written, so WhatsApp's window is open: pending again at once, with every try
-- before it, and the follow-up job's next run sends them through the Messages API, each from the
-- part it got to, and stores them in the thread then; out of the thread until then (they were
-- stored there when taken): the agent has not said them yet. Only the person's own, or the one's
-- they were linked into since the turn began, taken by that message: still with it, or let go by
-- its answer's end (a fallback's end_attempt lets go of the ones its answer said, these among
-- them). Their conversation is locked first, as a link locks it before it moves anything (so a
-- link in progress is waited for, and whose they are read after it); then the follow-ups and
-- their thread messages only where no one holds them (`skip locked`): forgetting takes messages
-- and follow-ups before the conversation, so this waits for nothing it holds, and what it skips
-- goes with the forgotten conversation. A purge deleting a thread message of one at that very
-- moment holds it too, and it stays with the message that took it, said by nothing (a thread
-- message older than the retention, of a follow-up no answer said: rare). {"pending": n}.
create function public.send_follow_ups_later(p_user_id uuid, p_message_id bigint, p_ids text)
    returns jsonb language plpgsql set search_path = '' as $$
declare
    v_ids bigint[] := (select coalesce(array_agg(e::bigint), '{}') from json_array_elements_text(p_ids::json) e);
    v_user uuid;
    v_later bigint[];
    v_stored bigint[];
begin
    perform from public.conversations c
     where c.id in (select f.conversation_id from public.follow_ups f where f.id = any(v_ids))
     order by c.id
       for update;
    v_user := coalesce((select x.into_user_id from public.merged_people x where x.from_user_id = p_user_id),
                       p_user_id);
    select coalesce(array_agg(l.id), '{}'), coalesce(array_agg(l.message_id) filter (where l.message_id is not null), '{}')
      into v_later, v_stored
      from (select f.id, f.message_id from public.follow_ups f
             where f.id = any(v_ids) and f.user_id in (p_user_id, v_user) and f.status = 'sent'
               and (f.said_with = p_message_id or f.said_with is null)
               for update skip locked) l;
    update public.follow_ups f
       set status = 'pending', next_attempt_at = clock_timestamp(), attempts = 0, said_with = null,
           sent_at = null, message_id = null
     where f.id = any(v_later);
    with gone as (
        delete from public.messages m
         where m.id in (select t.id from public.messages t
                         where t.id = any(v_stored) and t.user_id in (p_user_id, v_user) and t.role = 'assistant'
                           for update skip locked)
        returning m.conversation_id
    )
    -- a message gone from before a conversation's count mark: counted whole again, as after a purge
    update public.conversations c set counted = null, counted_at = null, counted_id = null
     where c.id in (select g.conversation_id from gone g) and c.counted is not null;
    return jsonb_build_object('pending', cardinality(v_later));
end;
$$;


-- The person's message a turn's follow-up is asked in (its conversation and sender are where it
-- is said), theirs or, after a link's merge, the person's it was merged into; null when neither's.
create function crossmem_private.turn_message(p_user_id uuid, p_message_id bigint) returns public.messages
    language sql stable set search_path = '' as $$
    select m.*
      from public.messages m
     where m.id = p_message_id and m.role = 'user'
       and (m.user_id = p_user_id
            or exists (select from public.merged_people x
                        where x.from_user_id = p_user_id and x.into_user_id = m.user_id));
$$;

-- finish_turn, and with it (same round trip) what the model's tools decided in this turn,
-- p_follow_ups as JSON: {"schedule": [{"content", "due_at", "timezone"}], "cancel": [id],
-- "timezone": name, "timezone_stated": true when the person said it}, and the held follow-ups the message took to say first that its TwiML answer
-- had no room for, "later": [id], left to the follow-up job (send_follow_ups_later, above). In
-- the round trip that stores the reply, not one of their own after it: a database that fails
-- after that answer leaves them with the message (its reply not stored, the message owed, every
-- answer to it says them first), never marked said and said by nothing (a review's finding).
-- Written only when the reply is stored; a follow-up is said where the
-- message was written (its conversation and sender). At most p_max_pending pending per person
-- (counted one turn at a time), never more than a year ahead. p_declined, p_merged: finish_turn's (a declined
-- turn's tools decided nothing, but the held follow-ups its answer had no room for still go to the
-- job). Answers finish_turn's result with 'scheduled' (the new ids), 'refused' (how many the limits
-- refused) and 'cancelled'.
create function public.finish_turn_follow_ups(
    p_user_id uuid,
    p_user_message_id bigint,
    p_content text,
    p_delivered boolean,
    p_unsent_from integer,
    p_attempt uuid,
    p_tokens integer,
    p_user_content text,
    p_follow_ups text,
    p_max_pending integer,
    p_reserved integer,
    p_reply_id bigint,
    p_language text,
    p_declined text,
    p_merged text
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_result jsonb := public.finish_turn(p_user_id, p_user_message_id, p_content, p_delivered, p_unsent_from,
                                         p_attempt, p_tokens, p_user_content, p_reserved, p_reply_id,
                                         p_language, p_declined, p_merged);
    v_changes jsonb := coalesce(nullif(p_follow_ups, '')::jsonb, '{}'::jsonb);
    v_asked public.messages;
    v_item record;
    v_pending integer;
    v_scheduled jsonb := '[]'::jsonb;
    v_refused integer := 0;
    v_cancelled integer := 0;
    v_id bigint;
    v_held boolean;
    v_now timestamptz := clock_timestamp();
begin
    if v_result->>'reply_id' is null then
        return v_result;
    end if;
    v_asked := crossmem_private.turn_message(p_user_id, p_user_message_id);
    if v_asked.id is null then
        return v_result;
    end if;
    if jsonb_array_length(coalesce(v_changes->'later', '[]')) > 0 then
        perform public.send_follow_ups_later(p_user_id, p_user_message_id, (v_changes->'later')::text);
    end if;
    if coalesce(v_changes->>'timezone', '') <> '' then
        insert into public.person_timezones (user_id, timezone, stated)
        values (v_asked.user_id, v_changes->>'timezone', coalesce((v_changes->>'timezone_stated')::boolean, false))
        on conflict (user_id) do update set timezone = excluded.timezone, stated = excluded.stated, updated_at = v_now
         where excluded.stated or not person_timezones.stated;  -- a browser's never replaces a stated one
    end if;
    delete from public.follow_ups f
     where f.user_id = v_asked.user_id and f.status in ('pending', 'held')
       and f.id in (select value::bigint from jsonb_array_elements_text(coalesce(v_changes->'cancel', '[]')));
    get diagnostics v_cancelled = row_count;

    perform pg_advisory_xact_lock(hashtextextended('follow_ups/' || v_asked.user_id, 0));
    -- with the places other turns of the person's hold (reserve_follow_up); this turn's own become
    -- pending below, counted then
    v_pending := crossmem_private.follow_ups_counted(v_asked.user_id, v_asked.id, v_now);
    for v_item in
        select s.ordinality::integer as position, s.value->>'content' as content,
               (s.value->>'due_at')::timestamptz as due_at, coalesce(s.value->>'timezone', 'UTC') as timezone
          from jsonb_array_elements(coalesce(v_changes->'schedule', '[]')) with ordinality s
    loop
        -- Its place held by the tool (still held: a place given up may have been taken since) is
        -- its own whatever the count; without one, the count decides, as it did before places.
        v_held := exists (select from public.follow_ups f
                           where f.asked_in = v_asked.id and f.asked_order = v_item.position
                             and f.user_id = v_asked.user_id and f.status = 'reserved' and f.claimed_until >= v_now);
        if not v_held and v_pending >= p_max_pending or v_item.due_at > v_now + interval '366 days'
           or coalesce(v_item.content, '') = '' then
            v_refused := v_refused + 1;
            continue;
        end if;
        -- its place becomes it, with its id (at the time set_timezone may have moved it to)
        update public.follow_ups f
           set status = 'pending', content = v_item.content, due_at = v_item.due_at, timezone = v_item.timezone,
               next_attempt_at = v_item.due_at, claimed_until = null
         where f.asked_in = v_asked.id and f.asked_order = v_item.position and f.user_id = v_asked.user_id
           and f.status = 'reserved'
        returning f.id into v_id;
        if v_id is null then
            insert into public.follow_ups (user_id, conversation_id, surface, sender, asked_in, asked_order, content,
                                           due_at, timezone, next_attempt_at)
                 values (v_asked.user_id, v_asked.conversation_id, v_asked.surface, v_asked.sender, v_asked.id,
                         v_item.position, v_item.content, v_item.due_at, v_item.timezone, v_item.due_at)
            on conflict (asked_in, asked_order) do nothing
              returning id into v_id;
        end if;
        if v_id is not null then
            v_pending := v_pending + 1;
            v_scheduled := v_scheduled || to_jsonb(v_id);
        end if;
    end loop;
    -- a place this turn's tools held and its schedule no longer asks for (none, as the tool counts)
    delete from public.follow_ups f
     where f.asked_in = v_asked.id and f.user_id = v_asked.user_id and f.status = 'reserved';
    return v_result || jsonb_build_object('scheduled', v_scheduled, 'refused', v_refused, 'cancelled', v_cancelled);
end;
$$;


-- What counts against FOLLOW_UPS_PER_PERSON for p_user_id: the pending ones (pending, being sent,
-- held) and the places other turns hold (`reserved`, until their claimed_until; p_asked_in's own
-- are the caller's to count). Under the person's follow-ups lock (pg_advisory_xact_lock).
create function crossmem_private.follow_ups_counted(p_user_id uuid, p_asked_in bigint, p_now timestamptz)
    returns integer language sql stable set search_path = '' as $$
    select (select count(*) from public.follow_ups f
             where f.user_id = p_user_id and f.status in ('pending', 'sending', 'held'))::integer
         + (select count(*) from public.follow_ups f
             where f.user_id = p_user_id and f.status = 'reserved' and f.claimed_until >= p_now
               and f.asked_in is distinct from p_asked_in)::integer;
$$;


-- The schedule tool's round trip (core/follow_ups/capability.py): a place among the person's
-- p_max_pending for the follow-up a turn is scheduling, the p_position-th of its message
-- (p_message_id), held until p_hold_seconds from now, while the turn writes its answer; its
-- finish_turn_follow_ups makes it pending, its end without a reply (end_attempt) frees it, and one
-- of a turn that died is no longer counted after that time. Counted under the person's lock, as
-- finish_turn_follow_ups counts: two turns of the same person on two apps that schedule at once
-- cannot both be told "Scheduled" for the last place (a review's finding: the second was refused
-- by its finish, after the person had read "I'll remind you"). p_cancelled (a JSON array): the ids
-- the turn's cancel tool took back, not counted. Only p_user_id's message (or the person they were
-- linked into since). {"reserved": boolean, "pending": what counts, this one included when held}.
create function public.reserve_follow_up(
    p_user_id uuid, p_message_id bigint, p_position integer, p_content text, p_due_at timestamptz,
    p_timezone text, p_cancelled text, p_max_pending integer, p_hold_seconds integer
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_asked public.messages;
    v_pending integer;
    v_now timestamptz := clock_timestamp();
begin
    v_asked := crossmem_private.turn_message(p_user_id, p_message_id);
    if v_asked.id is null then
        return jsonb_build_object('reserved', false, 'pending', null);
    end if;
    perform pg_advisory_xact_lock(hashtextextended('follow_ups/' || v_asked.user_id, 0));
    -- places of turns that died, no longer counted: gone
    delete from public.follow_ups f
     where f.user_id = v_asked.user_id and f.status = 'reserved' and f.claimed_until < v_now;
    v_pending := crossmem_private.follow_ups_counted(v_asked.user_id, v_asked.id, v_now)
        + (select count(*) from public.follow_ups f
            where f.asked_in = v_asked.id and f.user_id = v_asked.user_id and f.status = 'reserved'
              and f.asked_order <> p_position)::integer
        - (select count(*) from public.follow_ups f
            where f.user_id = v_asked.user_id and f.status in ('pending', 'held')
              and f.id in (select e::bigint from json_array_elements_text(coalesce(nullif(p_cancelled, ''), '[]')::json) e))::integer;
    if v_pending >= p_max_pending then
        return jsonb_build_object('reserved', false, 'pending', v_pending);
    end if;
    insert into public.follow_ups (user_id, conversation_id, surface, sender, asked_in, asked_order, content, due_at,
                                   timezone, next_attempt_at, status, claimed_until)
         values (v_asked.user_id, v_asked.conversation_id, v_asked.surface, v_asked.sender, v_asked.id, p_position,
                 p_content, p_due_at, p_timezone, p_due_at, 'reserved', v_now + make_interval(secs => p_hold_seconds))
    on conflict (asked_in, asked_order) do update
       set content = excluded.content, due_at = excluded.due_at, timezone = excluded.timezone,
           next_attempt_at = excluded.next_attempt_at, claimed_until = excluded.claimed_until
     where follow_ups.status = 'reserved';
    return jsonb_build_object('reserved', true, 'pending', v_pending + 1);
end;
$$;


-- The web's and the CLI's cancel: {"cancelled": true} when the person had it pending or held.
create function public.cancel_follow_up(p_user_id uuid, p_id bigint) returns jsonb language plpgsql set search_path = '' as $$
begin
    delete from public.follow_ups f where f.id = p_id and f.user_id = p_user_id and f.status in ('pending', 'held');
    return jsonb_build_object('cancelled', found);
end;
$$;


-- The scheduled job's share of due follow-ups at p_now (the job's clock), under the claim id the
-- run drew (p_claim): up to p_limit pending ones due by then, oldest first, each taken (`for
-- update skip locked`) and marked `sending` until p_now + p_lease_seconds. Each comes with what
-- delivering it needs: `identity_user` (whom its chat or number belongs to now: an unlinked one
-- is no longer the person's), `last_sender` and `last_sender_user` (the chat or number the person
-- last wrote from on its app, a WhatsApp BSUID or number, and whom that belongs to now: said
-- there, whichever id they wrote with: a message of the thread, or a later one it does not keep,
-- wrote_outside_thread's) and, on a surface with a window (surface_has_window: WhatsApp's 24
-- hours), `window_opened_at` (the person's last message there, stored or not, never the agent's). First, a dead run's claims: the ones it
-- had begun to send (tried) are given up, as they may have gone out; the ones it never reached
-- are due again. Then up to p_limit holds for an opt-in that never came (`held_until` passed by
-- p_now: a week after they were due, core/follow_ups/opted_out.py) are given up unsaid, as an
-- opt-in that late would give them up (let_go_after_opt_in): held for ever, they stayed in the
-- person's list and counted against their limit. Found by their index, the oldest first, so a
-- run's work is bounded however many there are; the rest go at the next runs. The same call retried
-- after its first try committed (its answer lost with the connection) answers what p_claim
-- already holds, and claims nothing more. Answers {"claimed": [...], "lost": n, "expired": [ids of
-- the holds given up], "claim": p_claim}.
create function public.claim_due_follow_ups(p_now timestamptz, p_limit integer, p_lease_seconds integer, p_claim uuid)
    returns jsonb language plpgsql set search_path = '' as $$
declare
    v_lost integer := 0;
    v_expired jsonb := '[]'::jsonb;
    v_claimed jsonb;
begin
    if not exists (select from public.follow_ups f where f.status = 'sending' and f.claim = p_claim) then
        update public.follow_ups f set status = 'given_up', claimed_until = null, claim = null
         where f.status = 'sending' and f.claimed_until < p_now and f.tried_at is not null;
        get diagnostics v_lost = row_count;
        -- (a late run's mark committed meanwhile makes a row tried: it is left for the next run)
        update public.follow_ups f
           set status = 'pending', attempts = f.attempts - 1, claimed_until = null, claim = null
         where f.status = 'sending' and f.claimed_until < p_now and f.tried_at is null;
        with expired as (
            select f.id
              from public.follow_ups f
             where f.status = 'held' and f.held_until < p_now
             order by f.held_until
             limit p_limit
               for update skip locked
        ), given_up as (
            update public.follow_ups f set status = 'given_up', message_id = crossmem_private.kept_in_thread(f)
              from expired e
             where f.id = e.id
            returning f.id
        )
        select coalesce(jsonb_agg(g.id order by g.id), '[]'::jsonb) into v_expired from given_up g;
        with due as (
            select f.id
              from public.follow_ups f
             where f.status = 'pending' and f.next_attempt_at <= p_now
             order by f.next_attempt_at, f.id
             limit p_limit
               for update skip locked
        )
        update public.follow_ups f
           set status = 'sending', claimed_until = p_now + make_interval(secs => p_lease_seconds),
               attempts = f.attempts + 1, claim = p_claim, tried_at = null
          from due
         where f.id = due.id;
    end if;
    select coalesce(jsonb_agg(jsonb_build_object(
               'id', t.id, 'user_id', t.user_id, 'conversation_id', t.conversation_id, 'surface', t.surface,
               'sender', t.sender, 'content', t.content, 'due_at', t.due_at, 'attempts', t.attempts,
               'unsent_from', t.unsent_from, 'said_as', t.said_as,
               -- one said late says when it was due, on the person's clock and in their language
               -- (core/follow_ups/lateness.py): theirs now, else the one it was asked in
               'timezone', coalesce((select z.timezone from public.person_timezones z where z.user_id = t.user_id),
                                    t.timezone),
               'language', (select g.language from public.person_languages g where g.user_id = t.user_id),
               -- the person's chats or numbers there that opted out (identities.sql): nothing is sent to them
               'opted_out', crossmem_private.opted_out_of(t.user_id, t.surface),
               'identity_user', (select i.user_id from public.identities i
                                  where i.surface = t.surface and i.external_id = t.sender),
               'last_sender', w.sender,
               'last_sender_user', (select i.user_id from public.identities i
                                     where i.surface = t.surface and i.external_id = w.sender),
               -- only where it is read (a surface with a window): looked for on another app's, it
               -- read every message of a person who never wrote there
               'window_opened_at', case when public.surface_has_window(t.surface) then
                                       greatest((select max(m.created_at) from public.messages m
                                                  where m.user_id = t.user_id and m.surface = t.surface
                                                    and m.role = 'user'),
                                                u.unstored_message_at)
                                   end)
             order by t.next_attempt_at, t.id), '[]'::jsonb)
      into v_claimed
      from public.follow_ups t
      left join lateral (select m.sender, m.created_at
                           from public.messages m
                          where m.user_id = t.user_id and m.surface = t.surface and m.role = 'user'
                            and m.sender is not null
                          order by m.created_at desc, m.id desc
                          limit 1) l on true
      -- a message since that the thread does not keep (wrote_outside_thread): its number
      left join public.conversations u on u.user_id = t.user_id and u.surface = t.surface and u.surface <> 'web'
      cross join lateral (select case when u.unstored_message_at > coalesce(l.created_at, '-infinity')
                                      then u.unstored_message_from else l.sender end as sender) w
     where t.status = 'sending' and t.claim = p_claim;
    return jsonb_build_object('claimed', v_claimed, 'lost', v_lost, 'expired', v_expired, 'claim', p_claim);
end;
$$;


-- The person's apps a follow-up can be pushed on, but p_except's: in each, the chat or number they
-- last wrote from there (their latest message in their conversation there, or a later one it does
-- not keep, wrote_outside_thread's, which opened WhatsApp's window too; with none, a chat or
-- number linked to them, links.sql: sending its code was writing from it, though a command is no
-- message of the thread), whom that belongs to now (`sender_user`: an unlinked one is no longer
-- theirs) and when they wrote; the app they last wrote from first. One of each app. For where a
-- follow-up asked on the web goes, and where one goes when its app refuses it for good
-- (core/follow_ups/moves.py); begin_turn's too (turn_follow_ups).
-- An app whose chat or number opted out (identities.sql: an SMS number's STOP) is none: nothing
-- is sent there, and a follow-up placed there would be refused and lost, not said on the web.
create function crossmem_private.follow_up_apps(p_user_id uuid, p_except text)
    returns json language sql stable set search_path = '' as $$
    select coalesce(json_agg(json_build_object(
               'surface', a.surface, 'sender', a.sender, 'last_at', a.created_at,
               'sender_user', (select i.user_id from public.identities i
                                where i.surface = a.surface and i.external_id = a.sender))
             order by a.created_at desc, a.surface), '[]'::json)
      from (select distinct on (w.surface) w.surface, w.sender, w.created_at
              from (select c.surface,
                           case when c.unstored_message_at > coalesce(l.created_at, '-infinity')
                                then c.unstored_message_from else l.sender end as sender,
                           greatest(l.created_at, c.unstored_message_at) as created_at, true as in_thread
                      from public.conversations c
                      left join lateral (select m.sender, m.created_at
                                           from public.messages m
                                          where m.conversation_id = c.id and m.user_id = p_user_id
                                            and m.role = 'user' and m.sender is not null
                                          order by m.created_at desc, m.id desc
                                          limit 1) l on true
                     where c.user_id = p_user_id and c.surface <> 'web'
                       and coalesce(l.sender, c.unstored_message_from) is not null
                    union all
                    select i.surface, i.external_id, i.linked_at, false
                      from public.identities i
                     where i.user_id = p_user_id and i.linked_at is not null) w
             where w.surface <> p_except
             order by w.surface, w.in_thread desc, w.created_at desc) a
     where not crossmem_private.opted_out_of(p_user_id, a.surface) ? a.sender;
$$;

-- GET /follow-ups and `crossmem follow-ups` (core/follow_ups/listing.py): the person's pending
-- follow-ups (follow_ups_of) and, when one of them was asked on the web, the apps it would be pushed
-- on (follow_up_apps, the one they last wrote from first), in one call: the caller says where each
-- will be said, the first of those apps that still reaches them, as the turn's tools say it.
-- {"follow_ups": [...], "apps": [...]}.
create function public.follow_ups_with_apps(p_user_id uuid) returns json
    language plpgsql stable set search_path = '' as $$
declare
    v_pending json := public.follow_ups_of(p_user_id);
begin
    return json_build_object(
        'follow_ups', v_pending,
        'apps', case when exists (select from json_array_elements(v_pending) e where e->>'surface' = 'web')
                     then crossmem_private.follow_up_apps(p_user_id, 'web') else '[]'::json end);
end;
$$;

-- follow_up_apps for a follow-up its run holds (p_claim): the person's apps but the one it is on,
-- and last, for one asked on the web and pushed (moved_from 'web'), the web (no sender): with no
-- app left to push it on, it is said where it was asked, as one of a person with no app is.
-- {"apps": [...]}, empty when it is no longer that run's, or has moved on after a refusal already.
create function public.follow_up_elsewhere(p_id bigint, p_claim uuid) returns jsonb
    language sql stable set search_path = '' as $$
    select jsonb_build_object('apps', coalesce((select crossmem_private.follow_up_apps(f.user_id, f.surface)::jsonb
                                                       || case when f.moved_from = 'web'
                                                               then jsonb_build_array(jsonb_build_object(
                                                                        'surface', 'web', 'sender', null,
                                                                        'last_at', null, 'sender_user', null))
                                                               else '[]'::jsonb end
                                                  from public.follow_ups f
                                                 where f.id = p_id and f.claim = p_claim and f.status = 'sending'
                                                   and (f.moved_from is null or f.moved_from = 'web')),
                                                '[]'::jsonb));
$$;

-- A follow-up its run holds (p_claim), moved to another app of its person's (p_surface), to say
-- to p_sender there: its conversation becomes the person's one on that app, where it is stored
-- once said, and it is tried, held, templated or given up there as any follow-up of that app is
-- (`moved_from` keeps the app it leaves). Only one of which nothing went out (a move says it whole),
-- and once after a refusal: one that moved on from a refusing app moves no further. To the web
-- (p_surface 'web'), it goes back to the web conversation it was asked in (`asked_in`'s).
-- Both conversations are locked first, as finish_follow_up, forgetting and linking lock them
-- before a follow-up. The person's conversation there is made when they have none (a chat linked
-- and never written in since, or one they forgot). {"moved": boolean}: false when it is no longer
-- p_claim's, or its web conversation is gone. The same call retried after its first try
-- committed (its answer lost with the connection) finds it moved there and answers so again,
-- changing nothing: answered false, the run gave it up where it was; moved again, a move from the
-- web recorded the app it went to as the one it left.
create function public.move_follow_up(p_id bigint, p_claim uuid, p_surface text, p_sender text) returns jsonb
    language plpgsql set search_path = '' as $$
declare
    v_follow_up public.follow_ups;
    v_to uuid;
begin
    select * into v_follow_up from public.follow_ups f where f.id = p_id and f.claim = p_claim;
    if p_surface <> 'web' and v_follow_up.status = 'sending' then
        -- a chat linked with no message of the thread yet has no conversation: its first, as begin_turn's
        insert into public.conversations (user_id, surface, title)
             values (v_follow_up.user_id, p_surface, public.conversation_title(p_surface))
        on conflict (user_id, surface) where surface <> 'web' do nothing;
    end if;
    v_to := case when p_surface = 'web'
                 then (select m.conversation_id from public.messages m
                        where m.id = v_follow_up.asked_in and m.user_id = v_follow_up.user_id and m.surface = 'web')
                 else (select c.id from public.conversations c
                        where c.user_id = v_follow_up.user_id and c.surface = p_surface) end;
    perform from public.conversations c
     where c.id in (v_follow_up.conversation_id, v_to)
     order by c.id
       for key share;
    update public.follow_ups f
       set surface = p_surface, sender = p_sender, conversation_id = v_to, moved_from = f.surface,
           unsent_from = null, said_as = null
     where f.id = p_id and f.claim = p_claim and f.status = 'sending' and v_to is not null and f.surface <> p_surface
       and coalesce(f.unsent_from, 0) = 0 and (f.moved_from is null or f.moved_from = 'web');
    return jsonb_build_object('moved', found or coalesce(v_follow_up.status = 'sending' and v_follow_up.surface = p_surface
                                                         and v_follow_up.sender is not distinct from p_sender
                                                         and v_follow_up.moved_from is not null, false));
end;
$$;


-- The claimed follow-ups a run hands back untried (its time budget ran out before their turn):
-- pending again, due as they were, the attempt their claim counted taken back. Only the ones
-- still `sending` under p_claim: one given up meanwhile stays given up, and the same call retried
-- after it committed finds them pending, or claimed by a later run, and leaves them be. p_ids:
-- their ids, a JSON array. Answers {"released": n}.
create function public.release_follow_ups(p_ids text, p_claim uuid) returns jsonb language sql set search_path = '' as $$
    with released as (
        update public.follow_ups f set status = 'pending', attempts = f.attempts - 1, claimed_until = null
         where f.status = 'sending' and f.claim = p_claim and f.tried_at is null
           and f.id in (select value::bigint from jsonb_array_elements_text(p_ids::jsonb))
        returning f.id
    )
    select jsonb_build_object('released', count(*)) from released;
$$;


-- Just before a run sends a claimed follow-up: marked tried, so that if the run dies from here it
-- is given up rather than said twice. {"ok": false} when it is no longer p_claim's (a later run
-- took it over, or the person forgot it) or its lease has run out by the run's clock (p_now: a
-- run resumed late never starts a send a later run may make): not to be sent.
create function public.try_follow_up(p_id bigint, p_claim uuid, p_now timestamptz) returns jsonb
    language sql set search_path = '' as $$
    with tried as (
        update public.follow_ups f set tried_at = coalesce(f.tried_at, clock_timestamp())
         where f.id = p_id and f.claim = p_claim and f.status = 'sending' and f.claimed_until >= p_now
        returning f.id
    )
    select jsonb_build_object('ok', exists (select from tried));
$$;


-- What became of a claimed follow-up: 'sent' (stored in its conversation as the agent's message,
-- delivered), 'retry' (pending again from p_retry_at; p_unsent_from, when its first parts went
-- out, the part the retry starts from, never an earlier one, and p_said_as what they were cut
-- from, kept from the first parts on), 'held', 'opted_out' (held until its chat or number opts
-- in again: let_go_after_opt_in, or until p_held_until, when the job's claim gives it up; pending
-- again at once when none of the person's there is opted out any more, an opt-in that came after
-- the claim read it; p_unsent_from and p_said_as kept as a retry's, when the platform refused a
-- later part as opted out) or 'given_up' (stored in its
-- conversation, undelivered, when some of its parts went out: kept_in_thread). 'held' was decided on the person's
-- last WhatsApp message the claim saw (p_seen_at, null for none): when they have written since (a
-- message of the thread, or one it does not keep: wrote_outside_thread),
-- the window is open again, and it is pending again at once, its attempt not counted (held, only
-- their next message after this one would say it, days later perhaps). Only while it is
-- still p_claim's (`sending`): {"done": boolean, "message_id"}. The same call retried after it
-- committed (its answer lost with the connection) finds its own outcome and answers it again.
create function public.finish_follow_up(
    p_id bigint, p_claim uuid, p_outcome text, p_retry_at timestamptz, p_unsent_from integer, p_seen_at timestamptz,
    p_said_as text, p_held_until timestamptz
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_follow_up public.follow_ups;
    v_message bigint;
begin
    -- Its conversation first, as forgetting and linking lock them (the conversation, then its
    -- follow-ups): in the other order a forget at the same moment could deadlock with this.
    perform from public.conversations c
     where c.id = (select f.conversation_id from public.follow_ups f where f.id = p_id)
       for key share;
    select * into v_follow_up from public.follow_ups f where f.id = p_id and f.claim = p_claim for update;
    if v_follow_up.id is null then
        return jsonb_build_object('done', false);  -- given up as a dead run's, forgotten, or claimed again
    end if;
    if v_follow_up.status <> 'sending' then
        return jsonb_build_object('done', true, 'message_id', v_follow_up.message_id);
    end if;
    if p_outcome = 'sent' then
        insert into public.messages (conversation_id, user_id, surface, role, content, delivered_at)
             values (v_follow_up.conversation_id, v_follow_up.user_id, v_follow_up.surface, 'assistant',
                     v_follow_up.content, clock_timestamp())
          returning id into v_message;
        update public.conversations c set updated_at = clock_timestamp() where c.id = v_follow_up.conversation_id;
        update public.follow_ups f
           set status = 'sent', sent_at = clock_timestamp(), message_id = v_message, claimed_until = null
         where f.id = p_id;
    elsif p_outcome = 'retry' then
        update public.follow_ups f
           set status = 'pending', next_attempt_at = p_retry_at, claimed_until = null,
               unsent_from = greatest(p_unsent_from, f.unsent_from),
               said_as = coalesce(f.said_as, case when p_unsent_from > 0 then p_said_as end)
         where f.id = p_id;
    elsif p_outcome = 'given_up' and greatest(p_unsent_from, v_follow_up.unsent_from) > 0 then
        v_follow_up.unsent_from := greatest(p_unsent_from, v_follow_up.unsent_from);
        v_message := crossmem_private.kept_in_thread(v_follow_up);
        update public.follow_ups f
           set status = 'given_up', message_id = v_message, claimed_until = null,
               unsent_from = v_follow_up.unsent_from
         where f.id = p_id;
    elsif p_outcome = 'held' and (exists (
              select from public.messages m
               where m.user_id = v_follow_up.user_id and m.surface = v_follow_up.surface and m.role = 'user'
                 and m.created_at > coalesce(p_seen_at, '-infinity')) or exists (
              select from public.conversations c
               where c.user_id = v_follow_up.user_id and c.surface = v_follow_up.surface
                 and c.unstored_message_at > coalesce(p_seen_at, '-infinity'))) then
        update public.follow_ups f
           set status = 'pending', next_attempt_at = clock_timestamp(), attempts = f.attempts - 1,
               claimed_until = null
         where f.id = p_id;
    elsif p_outcome = 'opted_out'
          and crossmem_private.opted_out_of(v_follow_up.user_id, v_follow_up.surface) = '[]'::jsonb then
        -- due as it was (its claim found it due): the next run says it, from the part it got to
        update public.follow_ups f set status = 'pending', attempts = f.attempts - 1, claimed_until = null,
               unsent_from = greatest(p_unsent_from, f.unsent_from),
               said_as = coalesce(f.said_as, case when p_unsent_from > 0 then p_said_as end)
         where f.id = p_id;
    elsif p_outcome in ('held', 'opted_out', 'given_up') then
        -- an opt-out refused by the platform mid-text (its 21610 on a later part): the rest after START
        update public.follow_ups f set status = case when p_outcome = 'given_up' then 'given_up' else 'held' end,
               claimed_until = null, held_until = case when p_outcome = 'opted_out' then p_held_until end,
               unsent_from = case when p_outcome = 'opted_out' then greatest(p_unsent_from, f.unsent_from)
                                  else f.unsent_from end,
               said_as = case when p_outcome = 'opted_out'
                              then coalesce(f.said_as, case when p_unsent_from > 0 then p_said_as end)
                              else f.said_as end
         where f.id = p_id;
    else
        raise exception 'unknown outcome %', p_outcome using errcode = '22023';
    end if;
    return jsonb_build_object('done', true, 'message_id', v_message);
end;
$$;
