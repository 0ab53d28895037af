-- A per-person budget: at most TURNS_PER_MINUTE and TURNS_PER_DAY turns, and TOKENS_PER_DAY
-- model tokens, across all of a person's apps (0 turns a limit off). Counted inside
-- begin_turn's round trip (a turn still costs two); the tokens come with finish_turn's and
-- end_attempt's, added, never written over. Over it, begin_turn stores nothing and answers
-- {"limited_until"}.
--
-- The tokens are a ceiling, not a tally after the fact: a turn reserves what it may spend when
-- it starts (begin_turn, turn.sql: its input, estimated before the model is asked, and the most
-- the model may write, for each request it may make) and settles to what it spent when it ends
-- (finish_turn or end_attempt give the reservation back and add the tokens). `tokens` holds both,
-- `reserved` the part not settled yet, so the budget's check sees the turns still running. A
-- reservation whose instance died is never settled: it counts, as if spent, until its row leaves
-- the day.
--
-- A day is 24 hours, on whatever TimeZone the database's sessions have: interval '1 day' is a
-- calendar day on that clock, 23 or 25 hours on the night it changes.
--
-- turn_usage holds one row per stored turn and no text, and lives a day: forgetting a
-- conversation does not give its turns back, and the purge of old messages does not touch
-- it. Its rows are kept with no foreign key, so a deleted message leaves its count behind.

create table public.turn_usage (
    message_id bigint primary key,
    user_id uuid not null,
    at timestamptz not null default clock_timestamp(),
    tokens integer not null default 0,
    -- of `tokens`, what turns of this message reserved and have not settled yet
    reserved integer not null default 0,
    -- the attempts end_attempt has settled: a call retried after its commit settles nothing twice
    settled uuid[] not null default '{}',
    -- The chat that spent it (its message's surface and sender; the web's, no chat): unlinking takes
    -- the chat's day with it (links.sql's unlink_identities) once its messages are forgotten too.
    surface public.surface,
    sender text
);
alter table public.turn_usage enable row level security;  -- who reads what: access.sql
create index turn_usage_by_user on public.turn_usage (user_id, at desc);


-- When the person may write again, or null when they may now. Each limit is a sliding
-- window: a person at the limit may write again when the oldest turn that keeps them
-- there leaves the window. Drops the person's rows older than a day as it goes.
create or replace function public.turn_budget_until(
    p_user_id uuid, p_turns_per_minute integer, p_turns_per_day integer, p_tokens_per_day integer
) returns timestamptz language plpgsql set search_path = '' as $$
declare
    v_now timestamptz := clock_timestamp();
    v_until timestamptz;
    v_at timestamptz;
    v_settled_by timestamptz;
    v_running bigint;
begin
    delete from public.turn_usage u where u.user_id = p_user_id and u.at <= v_now - interval '24 hours';
    if p_turns_per_minute > 0 then
        select u.at into v_at from public.turn_usage u
         where u.user_id = p_user_id and u.at > v_now - interval '1 minute'
         order by u.at desc offset p_turns_per_minute - 1 limit 1;
        v_until := greatest(v_until, v_at + interval '1 minute');
    end if;
    if p_turns_per_day > 0 then
        select u.at into v_at from public.turn_usage u
         where u.user_id = p_user_id
         order by u.at desc offset p_turns_per_day - 1 limit 1;
        v_until := greatest(v_until, v_at + interval '24 hours');
    end if;
    if p_tokens_per_day > 0 then
        -- The earliest turn whose leaving brings the day's tokens under the budget.
        select w.at into v_at
          from (select u.at, sum(u.tokens) over (order by u.at, u.message_id) as through,
                       sum(u.tokens) over () as total
                  from public.turn_usage u where u.user_id = p_user_id) w
         where w.total >= p_tokens_per_day and w.total - w.through < p_tokens_per_day
         order by w.at limit 1;
        if v_at is not null then
            -- Over it only by what the person's turns still answering reserved (their other apps'
            -- messages of this moment): those settle, to what they spent, by their answer_by, so
            -- the person may write again then, not a day later. A reservation whose attempt's time
            -- is up (its instance died) counts as spent.
            select max(m.answer_by), sum(u.reserved) into v_settled_by, v_running
              from public.turn_usage u
              join public.messages m on m.id = u.message_id and m.user_id = p_user_id
             where u.user_id = p_user_id and u.reserved > 0 and m.answer_by > v_now;
            if v_running > 0 and (select sum(u.tokens) from public.turn_usage u where u.user_id = p_user_id)
                                 - v_running < p_tokens_per_day then
                v_until := greatest(v_until, v_settled_by);
            else
                v_until := greatest(v_until, v_at + interval '24 hours');
            end if;
        end if;
    end if;
    return v_until;
end;
$$;


-- Listening, budgeted apart (VOICE_SECONDS_PER_DAY, 0: no limit): the seconds of voice a person
-- had transcribed in the last day, on any app. A note's seconds are reserved before it is sent to
-- the transcriber (what the note says it lasts, never less than its bytes imply) and settled at
-- what the transcriber heard, so a client that lies about a note's length pays for what was heard.
-- One note of a person's is reserved and not yet settled at a time (for at most two minutes, in
-- case its instance died): requests in parallel cannot each slip a lie under the day before any
-- is settled. Kept a day, per user message (its notes added up), like turn_usage: forgetting
-- gives none back; the operator's erasure does (forgetting.sql).
create table public.voice_usage (
    user_id uuid not null,
    message_id bigint not null,
    at timestamptz not null default clock_timestamp(),
    seconds integer not null check (seconds >= 0),
    -- while a note of this message is at the transcriber: when it was reserved
    in_flight_since timestamptz,
    -- the chat that spent it, as turn_usage's
    surface public.surface,
    sender text,
    primary key (user_id, message_id)
);
alter table public.voice_usage enable row level security;  -- who reads what: access.sql

-- Reserve p_seconds of the person's day for a note of message p_message_id: 'reserved', or
-- 'used_up' (the day's seconds would be past), or 'busy' (another of their notes is at the
-- transcriber). A person's reservations are made one at a time.
create or replace function public.reserve_voice_seconds(
    p_user_id uuid, p_message_id bigint, p_seconds integer, p_seconds_per_day integer
) returns text language plpgsql set search_path = '' as $$
declare
    v_now timestamptz := clock_timestamp();
    v_surface public.surface;
    v_sender text;
begin
    if p_seconds_per_day <= 0 then
        return 'reserved';
    end if;
    perform pg_advisory_xact_lock(hashtextextended('voice/' || p_user_id, 0));
    delete from public.voice_usage v where v.user_id = p_user_id and v.at <= v_now - interval '24 hours';
    if exists (select from public.voice_usage v
                where v.user_id = p_user_id and v.message_id <> p_message_id
                  and v.in_flight_since > v_now - interval '2 minutes') then
        return 'busy';
    end if;
    if (select coalesce(sum(v.seconds), 0) from public.voice_usage v where v.user_id = p_user_id)
       + greatest(p_seconds, 0) > p_seconds_per_day then
        return 'used_up';
    end if;
    select m.surface, m.sender into v_surface, v_sender from public.messages m where m.id = p_message_id;
    insert into public.voice_usage (user_id, message_id, seconds, in_flight_since, surface, sender)
         values (p_user_id, p_message_id, greatest(p_seconds, 0), v_now, v_surface, v_sender)
    on conflict (user_id, message_id) do update
        set seconds = public.voice_usage.seconds + excluded.seconds, in_flight_since = v_now;
    return 'reserved';
end;
$$;

-- A count once a reservation in it is settled, the one rule of the day's tokens (turn.sql's
-- settle_turn_tokens) and of its seconds of listening (below): what was reserved given back, never
-- more than p_unsettled (what is still reserved: a retried call gives nothing back twice) and
-- never below zero, and what was spent added. A SQL-standard body, bound when it is created (no
-- search_path can change what it calls), so the planner inlines it into each update: a `set
-- search_path` would make it a call planned again at every turn.
create function crossmem_private.settled(p_count integer, p_unsettled integer, p_reserved integer, p_spent integer)
    returns integer language sql immutable parallel safe
    return greatest(p_count - least(greatest(p_reserved, 0), p_unsettled), 0) + greatest(p_spent, 0);

-- A reservation settled at what was heard (what it said, when the transcriber failed: it may
-- have been paid for all the same); the person's next note may then go.
create or replace function public.settle_voice_seconds(
    p_user_id uuid, p_message_id bigint, p_reserved integer, p_heard integer
) returns void language plpgsql set search_path = '' as $$
begin
    update public.voice_usage v
       set seconds = crossmem_private.settled(v.seconds, v.seconds, p_reserved, p_heard), in_flight_since = null
     where v.user_id = p_user_id and v.message_id = p_message_id;
end;
$$;

-- Both tables live a day: a person's turn drops their own older rows as it goes, and the scheduled
-- job drops everyone's here (core/memory/retention.py's expire_usage), so the counts of people who never
-- write again, and of chats unlinked that never wrote again (links.sql), go too. At most p_limit
-- rows of each table a call (a scan of a day's rows, no index of its own: every turn would pay for
-- one); {"turn_usage": n, "voice_usage": n}, what went. Rows a turn holds (its own delete, a
-- link's move) are skipped, never waited for: the job and a turn lock a person's rows in
-- different orders, and waiting could deadlock them; the next run takes what is left.
create or replace function public.expire_usage(p_limit integer) returns jsonb
    language plpgsql set search_path = '' as $$
declare
    v_cutoff timestamptz := clock_timestamp() - interval '24 hours';
    v_turns integer;
    v_voice integer;
begin
    delete from public.turn_usage u
     where u.ctid = any (array(select o.ctid from public.turn_usage o where o.at <= v_cutoff
                                  limit p_limit for update skip locked));
    get diagnostics v_turns = row_count;
    delete from public.voice_usage v
     where v.ctid = any (array(select o.ctid from public.voice_usage o where o.at <= v_cutoff
                                  limit p_limit for update skip locked));
    get diagnostics v_voice = row_count;
    return jsonb_build_object('turn_usage', v_turns, 'voice_usage', v_voice);
end;
$$;
