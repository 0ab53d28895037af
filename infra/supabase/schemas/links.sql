-- Identity linking: one person on every app.
--
-- A signed-in web person asks for a link code; a Telegram chat or a WhatsApp number that
-- sends it becomes theirs. When that identity already had a person of its own (made by
-- IDENTITY_POLICY=auto for an unknown sender), that person's history moves to the web
-- person in the same transaction (with their consent when the chat has messages), so
-- nothing said before the link is lost.
--
-- What happens at the same time: a turn reads the identity `for key share`, so a link (which
-- holds it `for update`) finishes first; a reply written after its question was merged into
-- another person is accepted (merged_people); a chat linked to one web account is never
-- moved to another by a code (it must be unlinked first); a first message and a /start CODE
-- of a new chat arriving together do not collide on the identity's primary key.
--
-- Tables: link_codes (only a hash of each code), link_attempts (wrong codes, per identity,
-- for the hourly limit; forgetting.sql counts a wrong forget code of an SMS number there too),
-- merged_people (who was merged into whom).

create table public.link_codes (
    -- sha256 of the code as typed, upper-cased, without spaces or dashes; never the code.
    code_hash text primary key check (code_hash ~ '^[0-9a-f]{64}$'),
    user_id uuid not null,
    created_at timestamptz not null default clock_timestamp(),
    expires_at timestamptz not null,
    used_at timestamptz,
    used_by_surface public.chat_surface,
    used_by_external_id text,
    -- The account the code belongs to (masked, as the person's token named it), so that the
    -- chat that redeems it can be told whose account it joins.
    account text not null default ''
);
alter table public.link_codes enable row level security;  -- who reads what: access.sql
create index link_codes_by_user on public.link_codes (user_id);

-- The secret that the six digits a code gives an identity are drawn from (link_confirmation): one
-- random value, made with the schema, in the schema no token reaches (access.sql). Not a column of
-- link_codes: a person reads their own codes' rows, and with it could work out the digits.
create table crossmem_private.link_confirmation_key (
    only_row boolean primary key default true check (only_row),
    key uuid not null default gen_random_uuid()
);
insert into crossmem_private.link_confirmation_key default values;

create table public.link_attempts (
    surface public.chat_surface not null,
    external_id text not null,
    attempted_at timestamptz not null default clock_timestamp(),
    -- The platform's id of the message that carried the code (a Telegram update_id, a Twilio
    -- MessageSid): a redelivery of it is one attempt, not another.
    delivery text
);
alter table public.link_attempts enable row level security;  -- who reads what: access.sql
create index link_attempts_by_identity on public.link_attempts (surface, external_id, attempted_at desc);
create unique index link_attempts_once on public.link_attempts (surface, external_id, delivery)
    where delivery is not null;

create table public.merged_people (
    from_user_id uuid primary key,
    into_user_id uuid not null,
    merged_at timestamptz not null default clock_timestamp()
);
alter table public.merged_people enable row level security;  -- who reads what: access.sql
create index merged_people_into on public.merged_people (into_user_id);


-- A new code for a person; their earlier unused codes stop working (the newest one is the
-- one on their screen).
create or replace function public.create_link_code(p_user_id uuid, p_code_hash text, p_ttl_minutes integer, p_account text)
    returns jsonb language plpgsql set search_path = '' as $$
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

-- Join an identity to a person (the code's, or an operator's choice).
--   not known yet        -> a new identity of the person
--   already the person's -> nothing to do
--   linked to another    -> {"status": "linked_elsewhere"}: it must be unlinked first
--   made by `auto`       -> the identity and all of its person's history move to the person;
--                           a Telegram or WhatsApp conversation the person already has takes
--                           the other's messages (their created_at keeps the order), so one
--                           conversation per surface still holds; the merge is recorded in
--                           merged_people
-- Returns {"status": "linked"|"already_linked"|"linked_elsewhere", "user_id", "moved_messages"}.
create or replace function public.link_identity(p_user_id uuid, p_surface text, p_external_id text)
    returns jsonb language plpgsql set search_path = '' as $$
declare
    v_previous uuid;
    v_linked_at timestamptz;
    v_from record;
    v_into uuid;
    v_moved integer := 0;
    v_count integer;
begin
    -- A name that is no surface at all is refused by the identity's type (surfaces.sql).
    if p_surface is null or p_surface = 'web' or coalesce(p_external_id, '') = '' then
        raise exception 'only a chat''s identity (not the web''s) with an id is linked' using errcode = '22023';
    end if;
    insert into public.identities (surface, external_id, user_id, linked_at)
         values (p_surface, p_external_id, p_user_id, clock_timestamp())
    on conflict (surface, external_id) do nothing;
    if found then
        -- A chat unlinked today and linked again before it wrote: what it spent comes back with it,
        -- as it would to the person its next message made (turn.sql's claim_unlinked_usage).
        perform crossmem_private.claim_unlinked_usage(p_surface, p_external_id, p_user_id);
        return jsonb_build_object('status', 'linked', 'user_id', p_user_id, 'moved_messages', 0);
    end if;
    select i.user_id, i.linked_at into v_previous, v_linked_at
      from public.identities i
     where i.surface = p_surface and i.external_id = p_external_id
       for update;

    if v_previous = p_user_id then
        update public.identities i set linked_at = coalesce(i.linked_at, clock_timestamp())
         where i.surface = p_surface and i.external_id = p_external_id;
        return jsonb_build_object('status', 'already_linked', 'user_id', p_user_id, 'moved_messages', 0);
    end if;
    if v_linked_at is not null then
        return jsonb_build_object('status', 'linked_elsewhere');
    end if;

    -- The previous person was this identity alone: their whole history is the person's now.
    for v_from in
        select c.id, c.surface from public.conversations c where c.user_id = v_previous for update
    loop
        v_into := null;
        if v_from.surface <> 'web' then
            select c.id into v_into
              from public.conversations c
             where c.user_id = p_user_id and c.surface = v_from.surface
               for update;
        end if;
        if v_into is null then
            update public.conversations c set user_id = p_user_id where c.id = v_from.id;
            update public.messages m set user_id = p_user_id where m.conversation_id = v_from.id;
            get diagnostics v_count = row_count;
        else
            -- A delivery both conversations hold (it cannot happen with Telegram's and
            -- Twilio's ids, but a constraint is a constraint) is kept once: the person's.
            delete from public.messages m
             where m.conversation_id = v_from.id
               and m.external_id is not null
               and exists (select from public.messages x
                            where x.conversation_id = v_into
                              and x.surface = m.surface and x.external_id = m.external_id);
            update public.messages m set conversation_id = v_into, user_id = p_user_id
             where m.conversation_id = v_from.id;
            get diagnostics v_count = row_count;
            update public.conversations c
               set updated_at = greatest(c.updated_at, (select f.updated_at from public.conversations f
                                                         where f.id = v_from.id)),
                   counted = null, counted_at = null, counted_id = null  -- counted whole again (context.sql)
             where c.id = v_into;
            -- The later of the two messages outside the thread: the window it opened stays open
            -- (follow_ups.sql's wrote_outside_thread).
            update public.conversations c
               set unstored_message_at = f.unstored_message_at, unstored_message_from = f.unstored_message_from
              from public.conversations f
             where c.id = v_into and f.id = v_from.id
               and f.unstored_message_at > coalesce(c.unstored_message_at, '-infinity');
            delete from public.conversations c where c.id = v_from.id;
        end if;
        v_moved := v_moved + v_count;
    end loop;
    -- The day's budget goes with them: a linked chat counts with its web account (budget.sql).
    update public.turn_usage u set user_id = p_user_id where u.user_id = v_previous;
    update public.voice_usage v set user_id = p_user_id where v.user_id = v_previous;
    -- The language and the timezone too, each unless the person has one learned later (a timezone:
    -- one they stated before one a browser sent, then the later) (person_languages, person_timezones:
    -- follow_ups.sql).
    insert into public.person_languages (user_id, language, updated_at)
    select p_user_id, l.language, l.updated_at from public.person_languages l where l.user_id = v_previous
    on conflict (user_id) do update set language = excluded.language, updated_at = excluded.updated_at
     where person_languages.updated_at < excluded.updated_at;
    delete from public.person_languages l where l.user_id = v_previous;
    insert into public.person_timezones (user_id, timezone, stated, updated_at)
    select p_user_id, t.timezone, t.stated, t.updated_at from public.person_timezones t where t.user_id = v_previous
    on conflict (user_id) do update set timezone = excluded.timezone, stated = excluded.stated,
                                        updated_at = excluded.updated_at
     where (person_timezones.stated, person_timezones.updated_at) < (excluded.stated, excluded.updated_at);
    delete from public.person_timezones t where t.user_id = v_previous;
    update public.identities i set user_id = p_user_id, linked_at = clock_timestamp()
     where i.user_id = v_previous;
    insert into public.merged_people (from_user_id, into_user_id) values (v_previous, p_user_id)
    on conflict (from_user_id) do update set into_user_id = excluded.into_user_id, merged_at = clock_timestamp();
    -- Whoever had been merged into the previous person now lives on in this one.
    update public.merged_people x set into_user_id = p_user_id where x.into_user_id = v_previous;
    return jsonb_build_object('status', 'linked', 'user_id', p_user_id, 'moved_messages', v_moved);
end;
$$;

-- The six digits a code gives one identity: drawn from the key above, which only the database
-- knows, so the code's person cannot work them out; the same for the same code and identity.
create function crossmem_private.link_confirmation(p_code_hash text, p_surface text, p_external_id text)
    returns text language sql stable set search_path = '' as $$
    select lpad(((('x' || left(md5(k.key::text || ':' || p_code_hash || ':' || p_surface || ':' || p_external_id),
                               8))::bit(32)::bigint) % 1000000)::text, 6, '0')
      from crossmem_private.link_confirmation_key k;
$$;

-- An identity's wrong codes (link codes; an SMS number's link digits and forget codes, forgetting.sql)
-- are taken one identity at a time (a lock for the rest of the transaction), so that guesses sent
-- at once are all counted. When the identity may try again, past p_max_attempts wrong codes in the
-- last hour (0: no limit); null while it may.
create function crossmem_private.wrong_codes_retry_at(p_surface text, p_external_id text, p_max_attempts integer)
    returns timestamptz language plpgsql set search_path = '' as $$
declare
    v_failures integer;
    v_first_failure timestamptz;
begin
    perform pg_advisory_xact_lock(hashtextextended('link:' || p_surface || ':' || p_external_id, 0));
    select count(*), min(a.attempted_at) into v_failures, v_first_failure
      from public.link_attempts a
     where a.surface = p_surface and a.external_id = p_external_id
       and a.attempted_at > clock_timestamp() - interval '1 hour';
    if p_max_attempts > 0 and v_failures >= p_max_attempts then
        return v_first_failure + interval '1 hour';
    end if;
    return null;
end;
$$;

-- One wrong code of an identity, counted once for each delivery that carried it (p_delivery, null
-- when none is known); the ones older than a day go.
create function crossmem_private.count_wrong_code(p_surface text, p_external_id text, p_delivery text)
    returns void language plpgsql set search_path = '' as $$
begin
    insert into public.link_attempts (surface, external_id, delivery) values (p_surface, p_external_id, p_delivery)
    on conflict (surface, external_id, delivery) where delivery is not null do nothing;
    delete from public.link_attempts a where a.attempted_at < clock_timestamp() - interval '1 day';
end;
$$;

-- Redeem a code sent from an identity: redeem_code's answer, and `language`: the language of the
-- identity's person once it is done (after a merge, the one the merge kept), which the chat is
-- answered in (docs/decisions.md, "The person's language"). One round trip.
create or replace function public.redeem_link_code(
    p_surface text,
    p_external_id text,
    p_code_hash text,
    p_max_attempts integer,
    p_consented boolean,
    p_vouched_for boolean,
    p_confirmation text,
    p_delivery text,  -- the platform's id of the message the code came in (count_wrong_code)
    p_sender_alias text  -- the sender's other id (a WhatsApp number beside its BSUID)
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_outcome jsonb := crossmem_private.redeem_code(p_surface, p_external_id, p_code_hash, p_max_attempts,
                                                    p_consented, p_vouched_for, p_confirmation, p_delivery,
                                                    p_sender_alias);
begin
    return v_outcome || jsonb_build_object('language', public.person_language(null, p_surface, p_external_id));
end;
$$;

-- One call: the hourly limit, the code (single-use: of two identities racing for it, exactly one
-- wins), consent, the link and the merge. Without p_consented, a valid code on a chat whose
-- person has a history links nothing and spends nothing: it answers {"status": "needs_consent",
-- "account", "messages"}. A history is messages, or what a purge of them leaves (the memory notes,
-- a conversation with its follow-ups), which a link would move to the account all the same. From
-- a sender its platform does not vouch for (p_vouched_for false: an SMS's caller ID, which a
-- forger can set), a valid code links only with p_confirmation, the six digits it gives this
-- identity: without them it answers {"status": "needs_confirmation", "account", "messages",
-- "confirmation"}, which the answer sends to the identity itself (a forger never reads it; its
-- holder's consent is typing them back); wrong ones count as a wrong code.
-- Returns {"status": "linked"|"already_linked"|"linked_elsewhere"|"needs_consent"|
-- "needs_confirmation"|"invalid"|"expired"|"used"|"too_many_attempts", ...}; every success names
-- the code's account.
create or replace function crossmem_private.redeem_code(
    p_surface text,
    p_external_id text,
    p_code_hash text,
    p_max_attempts integer,
    p_consented boolean,
    p_vouched_for boolean,
    p_confirmation text,
    p_delivery text,  -- the platform's id of the message the code came in (count_wrong_code)
    p_sender_alias text  -- the sender's other id (a WhatsApp number beside its BSUID)
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_alias public.identities;
    v_confirmation text;
    v_retry_at timestamptz;
    v_code record;
    v_status text;
    v_messages integer;
begin
    v_retry_at := crossmem_private.wrong_codes_retry_at(p_surface, p_external_id, p_max_attempts);
    if v_retry_at is not null then
        return jsonb_build_object('status', 'too_many_attempts', 'retry_at', v_retry_at);
    end if;
    -- A sender id never seen beside its other id is that id's person, as its turn would make it
    -- (turn.sql's turn_person): the code is for the person, both ids and their thread, which a
    -- link of the new id alone would leave behind (and `forget` from it, with the person).
    if p_sender_alias is not null and not exists (select from public.identities i
                                                   where i.surface = p_surface and i.external_id = p_external_id) then
        v_alias := crossmem_private.alias_identity(p_surface, p_external_id, p_sender_alias);  -- identities.sql
        if v_alias.user_id is not null then
            insert into public.identities (surface, external_id, user_id, linked_at)
                 values (p_surface, p_external_id, v_alias.user_id, v_alias.linked_at)
            on conflict (surface, external_id) do nothing;
        end if;
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
        perform crossmem_private.count_wrong_code(p_surface, p_external_id, p_delivery);
        return jsonb_build_object('status', v_status);
    end if;
    if exists (select from public.identities i
                where i.surface = p_surface and i.external_id = p_external_id
                  and i.linked_at is not null and i.user_id <> v_code.user_id) then
        return jsonb_build_object('status', 'linked_elsewhere');
    end if;
    if not p_consented or not p_vouched_for then
        select count(*) into v_messages
          from public.messages m
          join public.identities i on i.user_id = m.user_id
         where i.surface = p_surface and i.external_id = p_external_id and i.user_id <> v_code.user_id;
    end if;
    if not p_vouched_for then
        v_confirmation := crossmem_private.link_confirmation(p_code_hash, p_surface, p_external_id);
        if p_confirmation is null then
            return jsonb_build_object('status', 'needs_confirmation', 'account', v_code.account,
                                      'messages', v_messages, 'confirmation', v_confirmation);
        elsif p_confirmation <> v_confirmation then
            perform crossmem_private.count_wrong_code(p_surface, p_external_id, p_delivery);
            return jsonb_build_object('status', 'invalid');
        end if;
        -- typed back from the identity that was sent them: its holder's consent
    elsif not p_consented and (v_messages > 0 or exists (
              select from public.identities i
               where i.surface = p_surface and i.external_id = p_external_id and i.user_id <> v_code.user_id
                 and (exists (select from public.conversations c where c.user_id = i.user_id)
                      or exists (select from public.memory_notes n where n.user_id = i.user_id and n.revision > 0)))) then
        return jsonb_build_object('status', 'needs_consent', 'account', v_code.account, 'messages', v_messages);
    end if;
    update public.link_codes c
       set used_at = clock_timestamp(), used_by_surface = p_surface, used_by_external_id = p_external_id
     where c.code_hash = p_code_hash;
    return public.link_identity(v_code.user_id, p_surface, p_external_id) || jsonb_build_object('account', v_code.account);
end;
$$;

-- Unlink: the person's identities on a surface (the web's DELETE /links/<surface>), or one
-- identity (/unlink on Telegram, `unlink` on WhatsApp, the operator's command). Only linked
-- identities: one made by `auto` is its person's only way in. The person keeps every
-- message, and their language; the identity's next message starts a new person.
-- Returns {"unlinked", "follow_ups", "language"}: how many of its person's pending follow-ups were
-- asked from it; the language of the identity's person before (null for the
-- web's, which names no identity), which the chat is answered in.
create or replace function public.unlink_identities(
    p_surface text,
    p_user_id uuid,
    p_external_id text
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_count integer;
    v_follow_ups integer;
    v_language text := public.person_language(null, p_surface, p_external_id);
begin
    if p_user_id is null and p_external_id is null then
        raise exception 'unlink_identities needs a person or an identity' using errcode = '22023';
    end if;
    with gone as (
        delete from public.identities i
         where i.surface = p_surface
           and i.linked_at is not null
           and (p_user_id is null or i.user_id = p_user_id)
           and (p_external_id is null or i.external_id = p_external_id)
        returning i.surface, i.external_id, i.user_id
    ), turns as (
        -- What the chat spent today leaves with it, for the person its next message makes
        -- (turn_person): unlinking and linking again never starts a new day. Found by the chat the
        -- count names, not by its message: one forgotten or deleted since left its day behind, and
        -- the chat started a new one.
        update public.turn_usage u set user_id = crossmem_private.unlinked_person(g.surface, g.external_id)
          from gone g
         where u.user_id = g.user_id and u.at > clock_timestamp() - interval '24 hours'
           and u.surface = g.surface and u.sender = g.external_id
    ), voice as (
        update public.voice_usage v set user_id = crossmem_private.unlinked_person(g.surface, g.external_id)
          from gone g
         where v.user_id = g.user_id and v.at > clock_timestamp() - interval '24 hours'
           and v.surface = g.surface and v.sender = g.external_id
    ), windows as (
        -- When it last wrote outside the thread (follow_ups.sql's wrote_outside_thread) leaves too:
        -- no reminder of the person's is said to a number no longer theirs as if it had written.
        update public.conversations c set unstored_message_at = null, unstored_message_from = null
          from gone g
         where c.user_id = g.user_id and c.surface = g.surface and c.unstored_message_from = g.external_id
    )
    -- The follow-ups asked from an unlinked chat or number stay with its person, and reach it
    -- only if linked again before they are due (follow_ups.sql): its answer says how many.
    select (select count(*) from gone),
           (select count(*) from public.follow_ups f join gone g on f.user_id = g.user_id
             where f.surface = g.surface and f.sender = g.external_id and f.status in ('pending', 'held'))
      into v_count, v_follow_ups;
    return jsonb_build_object('unlinked', v_count, 'follow_ups', v_follow_ups, 'language', v_language);
end;
$$;

