-- Memory notes: what a person said before the window, condensed into one text per person.
--
-- A digest job (never a turn) claims the people who are due, asks a model (or the offline
-- extractive stand-in) for new notes from their previous notes and the messages that have
-- left the window, and writes them with the point they cover up to. The next turn's
-- begin_turn returns them in its one round trip.
--
-- Table: memory_notes, one row per person, reachable by user_id only (forgetting a person
-- deletes it with them). When linking merges two people, a trigger on identities moves the
-- merged person's notes (fold_memory_notes).
--
-- A purge by age (forgetting.sql's purge_messages) drops the note lines about the messages it
-- deletes: each line's day is read from its tag, and the table keeps, per person, when their
-- first line expires (first_line_expires_at, indexed), so the purge finds the notes that hold an
-- expired line without reading the others (purge_note_lines).

-- The notes as a purge with cutoff p_cutoff leaves them: `kept`, every line that has not expired
-- by then, as it was and in its place, and when the first of those expires. A line expires:
--   dated: when its day is over in every time zone, 12:00 UTC the next day (the day's end at
--   UTC-12): the day is on the person's clock (core/memory/digest.py's `tagged`), whatever their
--   zone, so a line outlives the last message of its day by a day and a half at most and never
--   goes before it. Its day is the first YYYY-MM-DD in its tag ("- [telegram · 2026-11-28] …"):
--   a line the model merged from several days holds words of the first, and goes with it;
--   without a day (no tag, "[telegram]", "[telegram · Sat 21:40]", "28 Nov", "2026-02-30": no
--   day that a year places; a day in the words after the tag is not the line's; a day after the
--   notes were written, p_written_at, on any clock (UTC+14): no message was said then, so it is
--   the day of what the line is about, "the dentist on 2027-03-01", and would outlive the purge of
--   the messages it came from by as long): when everything the notes cover is older
--   (p_covered_until, the newest message covered), the only messages it can be about; never while
--   the notes cover nothing;
--   blank: never (it is about nothing).
-- One function for both (the generated column's first expiry, with p_cutoff '-infinity', and the
-- purge's rewrite), so what the purge keeps is what the column says expires later: rewritten
-- notes are never taken again at the same cutoff.
create or replace function crossmem_private.notes_at_cutoff(
    p_content text,
    p_covered_until timestamptz,
    p_written_at timestamptz,
    p_cutoff timestamptz,
    out kept text,
    out first_line_expires_at timestamptz
) language plpgsql immutable parallel safe set search_path = '' as $$
begin
    select coalesce(string_agg(e.line, E'\n' order by e.n), ''), min(e.expires_at)
      into kept, first_line_expires_at
      from (select l.n, l.line,
                   case when btrim(l.line) <> '' then
                       coalesce(case when extract(month from d.day) = substr(t.said, 6, 2)::integer
                                          and not coalesce(d.day > (p_written_at at time zone interval '14 hours')::date,
                                                           false)
                                     then (d.day + 1)::timestamp at time zone 'UTC' + interval '12 hours' end,
                                p_covered_until) end as expires_at
              from string_to_table(p_content, E'\n') with ordinality l(line, n)
             -- The tag's first YYYY-MM-DD: where its digits, all written 9, read 9999-99-99 (no
             -- regular expression: a tenth of the time). Offset 0: each worked out once a line.
             cross join lateral (
                     select case when position('9999-99-99' in translate(g.tag, '012345678', '999999999')) > 0
                                 then substr(g.tag, position('9999-99-99' in translate(g.tag, '012345678', '999999999')), 10)
                                 end as said
                       from (select case when l.line like '- [%]%' then split_part(substr(l.line, 4), ']', 1) end as tag) g
                     offset 0) t
             cross join lateral (
                     select case when left(t.said, 4)::integer > 0 and substr(t.said, 6, 2)::integer between 1 and 12
                                      and right(t.said, 2)::integer between 1 and 31
                                 then make_date(left(t.said, 4)::integer, substr(t.said, 6, 2)::integer, 1)
                                      + (right(t.said, 2)::integer - 1) end as day
                     offset 0) d) e
     where coalesce(e.expires_at >= p_cutoff, true);
end;
$$;

create table public.memory_notes (
    user_id uuid primary key,
    content text not null default '' check (char_length(content) <= 64000),
    -- The newest message the notes cover, in the thread's order (created_at, id): every
    -- message of the person up to it is in the notes; null when none is.
    covered_until_at timestamptz,
    covered_until_id bigint,
    revision integer not null default 0,
    written_at timestamptz,
    -- Set when linking merged another person's notes in: the next digest folds them into one.
    pending_fold boolean not null default false,
    -- A digest run working on this person, and until when its claim holds. A run that died
    -- mid-way leaves a claim that simply expires. After a failed digest, no claim and a
    -- claimed_until ahead: the person's wait before the next try (fail_memory_digest).
    claim uuid,
    claimed_until timestamptz,
    -- When a digest of theirs last failed (the model down, declining, cut): the claim takes them
    -- after the people written or tried before, so those whose digest keeps failing never hold
    -- everyone else back.
    tried_at timestamptz,
    -- Their digests that failed in a row since the last one written: each doubles the wait.
    failures integer not null default 0,
    -- When the first of their note lines expires (notes_at_cutoff): a purge whose cutoff is past
    -- it has lines to drop here (purge_note_lines). Null: no line ever expires.
    first_line_expires_at timestamptz generated always as (
        (crossmem_private.notes_at_cutoff(content, covered_until_at, written_at, '-infinity')).first_line_expires_at) stored
);
alter table public.memory_notes enable row level security;  -- who reads what: access.sql
-- The digest's claim looks among the people whose notes were written in the last days too
-- (claim_memory_digests): a digest that left some of their messages for the next run.
create index memory_notes_by_written on public.memory_notes (written_at);
create index memory_notes_by_line_expiry on public.memory_notes (first_line_expires_at);


-- The messages of one person that have left the window and are not in the notes yet,
-- oldest first, at most p_limit: everything before the start of the window that Telegram
-- and WhatsApp show now (the latest messages within p_window_hours, stepped). Coverage is
-- a prefix of the thread, and the window's start only moves forward, so these are a
-- prefix of what is not covered. A declined turn's messages (messages.sql) come as a placeholder:
-- covered in their place, and their words never sent to a model again.
create or replace function public.messages_to_digest(
    p_user_id uuid,
    p_max_messages integer,
    p_window_step integer,
    p_window_hours integer,
    p_limit integer
) returns table (id bigint, conversation_id uuid, surface text, role text, content text, created_at timestamptz)
    language sql stable set search_path = '' as $$
    with notes as (
        select coalesce(n.covered_until_at, '-infinity'::timestamptz) as at, coalesce(n.covered_until_id, 0) as id
          from (select 1) one
          left join public.memory_notes n on n.user_id = p_user_id
    ), shown as (
        select public.window_keeps(count(*), p_max_messages, p_window_step) as keeps
          from public.messages m
         where m.user_id = p_user_id and m.created_at >= clock_timestamp() - make_interval(hours => p_window_hours)
    ), uncovered as (
        select m.*, row_number() over (order by m.created_at desc, m.id desc) as recency
          from public.messages m, notes
         where m.user_id = p_user_id and (m.created_at, m.id) > (notes.at, notes.id)
    )
    select u.id, u.conversation_id, u.surface, u.role,
           case when u.declined then '[a turn the assistant declined]' else u.content end, u.created_at
      from uncovered u, shown
     where u.recency > shown.keeps
     order by u.created_at, u.id
     limit p_limit;
$$;

-- Claim up to p_batch people who are due, for p_lease_seconds, and return for each the
-- claim, their notes and the messages to digest. Due:
--   at least one window step of their messages has left the window (the window steps:
--   that is each time it moves) uncovered, and the person has paused for p_idle_seconds: the prompt cache's lifetime,
--   so new notes never break a cache that their next turn would still have read;
--   or some have, and the person has been quiet for p_window_hours (their next message
--   would see none of it);
--   or linking merged two people's notes.
-- Any number of runs may claim at once: `for update skip locked` and the claim's expiry
-- give each due person to one of them. One whose digest failed is due but waits: its
-- claimed_until is ahead until the back-off ends (fail_memory_digest).
-- Returns [{"user_id", "claim", "notes", "pending_fold", "messages": [...]}].
create or replace function public.claim_memory_digests(
    p_batch integer,
    p_max_messages integer,
    p_window_step integer,
    p_window_hours integer,
    p_lease_seconds integer,
    p_digest_limit integer,
    p_user_id uuid,
    p_idle_seconds integer
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_now timestamptz := clock_timestamp();
    v_aged timestamptz := clock_timestamp() - make_interval(hours => p_window_hours);
    v_claim uuid := gen_random_uuid();
    v_due uuid[];
    v_claimed uuid[];
    v_person uuid;
    v_messages jsonb;
    v_result jsonb := '[]'::jsonb;
    v_notes record;
begin
    -- Who is due: per person, what is not covered yet, how many of their messages the
    -- window shows now (of those within p_window_hours), and when they last wrote. Looked for
    -- among the people who wrote, or whose notes were written, within twice p_window_hours (the
    -- last days' messages, by age; a digest that left some of a person's messages for the next
    -- run, as after a link), each read from their coverage on (by person): not every message of
    -- everyone's, which every run read (0.14 s at 1,000,000 messages, each minute). One quiet
    -- since is due within the first p_window_hours of it; one still not digested after twice that
    -- (every run failing) is due again when they next write.
    select coalesce(array_agg(d.user_id), '{}') into v_due
      from (select p.user_id
              from (select distinct m.user_id
                      from public.messages m
                     where p_user_id is null and m.created_at >= v_aged - make_interval(hours => p_window_hours)
                    union
                    select w.user_id
                      from public.memory_notes w
                     where p_user_id is null and w.written_at >= v_aged - make_interval(hours => p_window_hours)
                    union
                    select p_user_id where p_user_id is not null) p
              left join public.memory_notes n on n.user_id = p.user_id
             cross join lateral (
                    select count(*) filter (where n.covered_until_id is null
                                            or (m.created_at, m.id) > (n.covered_until_at, n.covered_until_id))
                           - public.window_keeps(count(*) filter (where m.created_at >= v_aged),
                                                 p_max_messages, p_window_step) as outside,
                           max(m.created_at) as newest
                      from public.messages m
                     where m.user_id = p.user_id
                       and m.created_at >= least(case when n.covered_until_id is null then '-infinity'
                                                      else n.covered_until_at end, v_aged)) t
             where (t.outside >= p_window_step and t.newest < v_now - make_interval(secs => p_idle_seconds))
                or (t.outside > 0 and t.newest < v_aged)
            union
            select n.user_id from public.memory_notes n
             where n.pending_fold and (p_user_id is null or n.user_id = p_user_id)) d;
    if cardinality(v_due) = 0 then
        return v_result;
    end if;

    insert into public.memory_notes (user_id)
    select unnest(v_due)
    on conflict (user_id) do nothing;

    with free as (
        select n.user_id
          from public.memory_notes n
         where n.user_id = any(v_due) and (n.claimed_until is null or n.claimed_until < v_now)
         order by greatest(n.written_at, n.tried_at) nulls first, n.user_id
         limit p_batch
           for update skip locked
    )
    update public.memory_notes n
       set claim = v_claim, claimed_until = v_now + make_interval(secs => p_lease_seconds)
      from free
     where n.user_id = free.user_id;
    select coalesce(array_agg(n.user_id), '{}') into v_claimed
      from public.memory_notes n where n.claim = v_claim;

    -- Read again now that the claim is held: a run that finished this person in the
    -- meantime has moved their coverage, and then nothing may be left to do.
    foreach v_person in array v_claimed loop
        select n.content, n.pending_fold into v_notes from public.memory_notes n where n.user_id = v_person;
        select coalesce(jsonb_agg(jsonb_build_object(
                   'id', d.id, 'conversation_id', d.conversation_id, 'surface', d.surface, 'role', d.role,
                   'content', d.content, 'created_at', d.created_at) order by d.created_at, d.id), '[]'::jsonb)
          into v_messages
          from public.messages_to_digest(v_person, p_max_messages, p_window_step, p_window_hours, p_digest_limit) d;
        if jsonb_array_length(v_messages) = 0 and not v_notes.pending_fold then
            update public.memory_notes n set claim = null, claimed_until = null
             where n.user_id = v_person and n.claim = v_claim;
            continue;
        end if;
        v_result := v_result || jsonb_build_array(jsonb_build_object(
            'user_id', v_person, 'claim', v_claim, 'notes', v_notes.content,
            'pending_fold', v_notes.pending_fold, 'messages', v_messages,
            'timezone', (select t.timezone from public.person_timezones t where t.user_id = v_person)));
    end loop;
    return v_result;
end;
$$;

-- What forgets, corrects or merges a person's messages calls this before it lets a running digest's
-- claim on them go (forgetting.sql's forget_conversations, turn.sql's edit_message,
-- fold_memory_notes): a claim making their notes row (claim_memory_digests, for a person with none
-- yet) reads their messages in the same statement, and a row it has not committed is not seen
-- by a statement of another transaction, whose delete or update would then leave that claim, and
-- the words it read, standing (the forgotten words sent to the model and written in the notes).
-- Making the row here waits for such a claim to end (the key is taken until it commits); the
-- caller's next statement sees its row. A person with no row gets an empty one, as a claim makes.
create or replace function crossmem_private.await_notes_claim(p_user_id uuid)
    returns void language plpgsql set search_path = '' as $$
begin
    insert into public.memory_notes (user_id) values (p_user_id) on conflict (user_id) do nothing;
end;
$$;

-- Whether a run's claim on a person still holds, asked just before their model call: a run asks
-- for one person after another, each call up to the model's timeout, and meanwhile the person may
-- have forgotten (their notes' row goes, claim and all), edited a message, been linked or purged
-- (the claim let go). Then the words it read at the claim go to no model: the next digest reads
-- what is left.
-- Returns {"holds": true|false}.
create or replace function public.memory_claim_holds(p_user_id uuid, p_claim uuid)
    returns jsonb language sql stable set search_path = '' as $$
    select jsonb_build_object('holds', exists (select from public.memory_notes n
                                                where n.user_id = p_user_id and n.claim = p_claim));
$$;

-- Write a person's new notes, covering up to the message (p_covered_at, p_covered_id), and
-- let the claim go. Only the holder of the claim may write: a run whose claim expired and
-- was taken by another writes nothing. Returns {"written": true|false, "revision"}.
create or replace function public.write_memory_notes(
    p_user_id uuid,
    p_claim uuid,
    p_content text,
    p_covered_at timestamptz,
    p_covered_id bigint
) returns jsonb language sql set search_path = '' as $$
    with written as (
        update public.memory_notes n
           set content = p_content,
               covered_until_at = coalesce(p_covered_at, n.covered_until_at),
               covered_until_id = coalesce(p_covered_id, n.covered_until_id),
               revision = n.revision + 1,
               written_at = clock_timestamp(),
               pending_fold = false,
               claim = null,
               claimed_until = null,
               failures = 0
         where n.user_id = p_user_id and n.claim = p_claim
        returning n.revision
    )
    select jsonb_build_object('written', count(*) > 0, 'revision', max(w.revision)) from written w;
$$;

-- A claimed person a run did not try (its time was up): let go as they were, no try recorded,
-- so the next run takes them in their place.
create or replace function public.release_memory_claim(p_user_id uuid, p_claim uuid)
    returns jsonb language sql set search_path = '' as $$
    with released as (
        update public.memory_notes n set claim = null, claimed_until = null
         where n.user_id = p_user_id and n.claim = p_claim
        returning n.user_id
    )
    select jsonb_build_object('released', count(*) > 0) from released;
$$;

-- A digest that failed (the model down, declining, timed out, cut, or answering no note): the
-- notes stay as they were and the person stays due, but waits before the next try, a wait that
-- doubles with each failure in a row (p_first_wait_seconds, twice that, ... at most
-- p_longest_wait_seconds; a digest written starts it again): one whose digest always fails costs
-- a few model calls a day, not one a minute. The wait holds the claim by no run (claimed_until
-- ahead, claim null), which claim_memory_digests already skips; tried_at puts them after the
-- others once it is over. Returns {"failed": true|false, "failures", "wait_s"}.
create or replace function public.fail_memory_digest(
    p_user_id uuid,
    p_claim uuid,
    p_first_wait_seconds integer,
    p_longest_wait_seconds integer
) returns jsonb language sql set search_path = '' as $$
    with failed as (
        update public.memory_notes n
           set claim = null,
               failures = n.failures + 1,
               tried_at = t.now,
               claimed_until = t.now + make_interval(secs => least(
                   p_first_wait_seconds * power(2, least(n.failures, 30)), p_longest_wait_seconds))
          from (select clock_timestamp() as now) t
         where n.user_id = p_user_id and n.claim = p_claim
        returning n.failures, extract(epoch from n.claimed_until - n.tried_at)::integer as wait_s
    )
    select jsonb_build_object('failed', count(*) > 0, 'failures', max(f.failures), 'wait_s', max(f.wait_s))
      from failed f;
$$;

-- One batch of a purge's notes (purge_messages calls it after each batch of messages): the notes
-- of at most p_limit people (null: no limit) that hold a line expired before p_cutoff lose those
-- lines (notes_at_cutoff), every other line kept as it was. What they cover stays: the purged
-- messages are not digested again, and the rest were digested already. A digest running on one
-- of them read the lines that went: it loses its claim, so its write (write_memory_notes) finds
-- none and cannot bring them back, and the next digest starts from what is left; a person waiting
-- after a failed digest keeps their wait. Rewritten notes hold no expired line (their
-- first_line_expires_at is past p_cutoff), so no batch takes a person twice; one a digest holds
-- locked at that moment is left for the next. p_dry_run counts the people and changes nothing.
-- Returns how many people's notes it rewrote (would rewrite).
create or replace function crossmem_private.purge_note_lines(p_cutoff timestamptz, p_limit integer, p_dry_run boolean)
    returns integer language plpgsql set search_path = '' as $$
declare
    v_people integer;
begin
    if p_dry_run then
        select count(*) into v_people from public.memory_notes n where n.first_line_expires_at < p_cutoff;
        return v_people;
    end if;
    with expired as (
        select n.user_id
          from public.memory_notes n
         where n.first_line_expires_at < p_cutoff
         order by n.first_line_expires_at
         limit p_limit
           for update skip locked
    )
    update public.memory_notes n
       set content = (crossmem_private.notes_at_cutoff(n.content, n.covered_until_at, n.written_at, p_cutoff)).kept,
           revision = n.revision + 1,
           claim = null,
           claimed_until = case when n.claim is null then n.claimed_until end
      from expired e
     where n.user_id = e.user_id;
    get diagnostics v_people = row_count;
    return v_people;
end;
$$;

-- A person's notes and when they were written (the web's GET /memory, the CLI's history).
create or replace function public.memory_notes_of(p_user_id uuid)
    returns jsonb language sql stable set search_path = '' as $$
    select jsonb_build_object('content', n.content, 'written_at', n.written_at,
                              'covered_until', n.covered_until_at, 'revision', n.revision)
      from public.memory_notes n
     where n.user_id = p_user_id and n.revision > 0;
$$;

-- Move one person's notes into another's (linking merged them): appended, and marked for
-- the next digest to fold into one. The coverage becomes the earlier of the two, a person
-- without notes covering nothing: every message the merged thread holds reaches the notes.
-- The joined notes are cut to the table's limit (the merged person's part, which comes last,
-- is cut): two full notes never fail a link. The next digest folds them into one within
-- MEMORY_NOTES_MAX_TOKENS. A digest of p_into running meanwhile loses its claim: it read neither
-- the merged notes nor the merged messages, and its write (write_memory_notes) would replace the
-- one and cover the other (older than what it digested), so that neither ever reached the notes.
create or replace function public.fold_memory_notes(p_from uuid, p_into uuid)
    returns void language plpgsql set search_path = '' as $$
declare
    v_from public.memory_notes;
begin
    delete from public.memory_notes n where n.user_id = p_from returning n.* into v_from;
    perform crossmem_private.await_notes_claim(p_into);
    update public.memory_notes n set claim = null, claimed_until = null
     where n.user_id = p_into and n.claim is not null;
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
           -- the later writing: a folded line's day is no later than it (notes_at_cutoff)
           written_at = greatest(n.written_at, v_from.written_at),
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

-- Linking merges a person `auto` made into another by moving their identities to that person
-- (link_identity): their notes go along. A trigger on that move rather than a line in
-- link_identity, so that whatever moves an identity to another person does it.
-- An identity that was linked (linked_at set) moves alone: its account keeps its notes.
create or replace function public.fold_notes_of_merged_people()
    returns trigger language plpgsql set search_path = '' as $$
declare
    v_merge record;
begin
    for v_merge in
        select distinct o.user_id as from_user_id, n.user_id as into_user_id
          from moved_old o
          join moved_new n on n.surface = o.surface and n.external_id = o.external_id
         where o.user_id <> n.user_id and o.linked_at is null
    loop
        perform public.fold_memory_notes(v_merge.from_user_id, v_merge.into_user_id);
    end loop;
    return null;
end;
$$;

create trigger identities_merge_memory_notes
    after update on public.identities
    referencing old table as moved_old new table as moved_new
    for each statement execute function public.fold_notes_of_merged_people();
