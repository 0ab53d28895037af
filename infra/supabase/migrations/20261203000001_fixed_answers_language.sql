-- The fixed answers given without a turn in the person's remembered language, a merge that
-- moves the timezone, and a stopped reply that is not owed (docs/decisions.md: "The person's
-- language", "Stop means stop"). Hand-written after the baseline (docs/deploy.md, "The schema and
-- its migrations"): each function as its definition now reads, copied from infra/supabase/schemas/;
-- `create or replace` keeps a database that has them (a new one, whose baseline links the
-- definitions) as it is. The two new functions get access.sql's grants, which ran before them.

create or replace function public.person_language(p_user_id uuid, p_surface text, p_external_id text)
    returns text language plpgsql stable set search_path = '' as $$
begin
    return (select l.language
              from public.person_languages l
             where l.user_id = coalesce(p_user_id, (select i.user_id from public.identities i
                                                     where i.surface = p_surface and i.external_id = p_external_id)));
end;
$$;

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
                                                         where f.id = v_from.id))
             where c.id = v_into;
            delete from public.conversations c where c.id = v_from.id;
        end if;
        v_moved := v_moved + v_count;
    end loop;
    -- The day's budget goes with them: a linked chat counts with its web account (budget.sql).
    update public.turn_usage u set user_id = p_user_id where u.user_id = v_previous;
    update public.voice_usage v set user_id = p_user_id where v.user_id = v_previous;
    -- The language and the timezone too, each unless the person has one learned later
    -- (person_languages, person_timezones: follow_ups.sql).
    insert into public.person_languages (user_id, language, updated_at)
    select p_user_id, l.language, l.updated_at from public.person_languages l where l.user_id = v_previous
    on conflict (user_id) do update set language = excluded.language, updated_at = excluded.updated_at
     where person_languages.updated_at < excluded.updated_at;
    delete from public.person_languages l where l.user_id = v_previous;
    insert into public.person_timezones (user_id, timezone, updated_at)
    select p_user_id, t.timezone, t.updated_at from public.person_timezones t where t.user_id = v_previous
    on conflict (user_id) do update set timezone = excluded.timezone, updated_at = excluded.updated_at
     where person_timezones.updated_at < excluded.updated_at;
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

create or replace function crossmem_private.redeem_code(
    p_surface text,
    p_external_id text,
    p_code_hash text,
    p_max_attempts integer,
    p_consented boolean
) returns jsonb language plpgsql set search_path = '' as $$
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

create or replace function public.redeem_link_code(
    p_surface text,
    p_external_id text,
    p_code_hash text,
    p_max_attempts integer,
    p_consented boolean
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_outcome jsonb := crossmem_private.redeem_code(p_surface, p_external_id, p_code_hash, p_max_attempts,
                                                    p_consented);
begin
    return v_outcome || jsonb_build_object('language', public.person_language(null, p_surface, p_external_id));
end;
$$;

create or replace function public.unlink_identities(
    p_surface text,
    p_user_id uuid,
    p_external_id text
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_count integer;
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
        -- (turn_person): unlinking and linking again never starts a new day.
        update public.turn_usage u set user_id = crossmem_private.unlinked_person(g.surface, g.external_id)
          from gone g, public.messages m
         where u.user_id = g.user_id and u.at > clock_timestamp() - interval '1 day'
           and m.id = u.message_id and m.surface = g.surface and m.sender = g.external_id
    ), voice as (
        update public.voice_usage v set user_id = crossmem_private.unlinked_person(g.surface, g.external_id)
          from gone g, public.messages m
         where v.user_id = g.user_id and v.at > clock_timestamp() - interval '1 day'
           and m.id = v.message_id and m.surface = g.surface and m.sender = g.external_id
    )
    select count(*) into v_count from gone;
    return jsonb_build_object('unlinked', v_count, 'language', v_language);
end;
$$;

create or replace function public.forget_request(
    p_surface text,
    p_confirm boolean,
    p_user_id uuid,
    p_sender_id text,
    p_window_minutes integer
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_user uuid := p_user_id;
    v_requested_at timestamptz;
    v_language jsonb;
begin
    if v_user is null then
        select i.user_id into v_user
          from public.identities i
         where i.surface = p_surface and i.external_id = p_sender_id;
    end if;
    if v_user is null then
        -- A sender who never wrote: nothing of theirs is stored, nothing to remember.
        return jsonb_build_object('status', 'unknown', 'messages', 0, 'conversations', 0);
    end if;
    v_language := jsonb_build_object('language', public.person_language(v_user, null, null));

    if not p_confirm then
        -- Requests nobody confirmed are kept a day at most (they say who considered forgetting).
        delete from public.forget_requests r where r.requested_at < clock_timestamp() - interval '1 day';
        insert into public.forget_requests (user_id, surface) values (v_user, p_surface)
        on conflict (user_id, surface) do update set requested_at = excluded.requested_at;
        return jsonb_build_object(
            'status', 'requested',
            'messages', (select count(*) from public.messages m where m.user_id = v_user),
            'conversations', (select count(*) from public.conversations c where c.user_id = v_user)) || v_language;
    end if;

    delete from public.forget_requests r
     where r.user_id = v_user and r.surface = p_surface
    returning r.requested_at into v_requested_at;
    if v_requested_at is null then
        return jsonb_build_object('status', 'no_request', 'messages', 0, 'conversations', 0) || v_language;
    end if;
    if v_requested_at < clock_timestamp() - make_interval(mins => p_window_minutes) then
        return jsonb_build_object('status', 'expired', 'messages', 0, 'conversations', 0) || v_language;
    end if;
    return jsonb_build_object('status', 'forgotten') || public.forget_person(v_user, false) || v_language;
end;
$$;

create or replace function public.claim_owed_replies(
    p_surfaces text, p_max_age_seconds integer, p_answer_within_seconds integer, p_limit integer,
    p_skip_users text, p_turns_per_minute integer, p_turns_per_day integer, p_tokens_per_day integer,
    p_window_hours integer, p_max_messages integer, p_window_step integer
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_now timestamptz := clock_timestamp();
    v_budgeted boolean := p_turns_per_minute > 0 or p_turns_per_day > 0 or p_tokens_per_day > 0;
    v_claimed jsonb := '[]'::jsonb;
    v_count integer := 0;
    v_candidate record;
    v_message record;
    v_attempt uuid;
    v_tries integer;
begin
    if p_limit <= 0 then
        return v_claimed;
    end if;
    -- The order needs every candidate's person (a window), which `for update` cannot be read
    -- with: each is locked on its own below, and skipped when another run holds it or has since
    -- answered it.
    for v_candidate in
        select c.id
          from (select m.id, m.owed_tries, m.answer_by, m.created_at,
                       sum(m.owed_tries) over (partition by m.user_id) as person_tries
                  from public.messages m
                 where m.role = 'user' and m.sender is not null
                   and m.created_at > v_now - make_interval(secs => p_max_age_seconds)
                   and m.surface = any (string_to_array(p_surfaces, ','))
                   and (m.answer_by is null or m.answer_by <= v_now)
                   and not exists (select from public.messages r where r.in_reply_to = m.id)
                   -- the person stopped its reply (messages.sql): not wanted, not owed
                   and not exists (select from public.stopped_generations s where s.message_id = m.id)
                   and m.user_id::text <> all (string_to_array(p_skip_users, ','))) c
         order by c.person_tries, c.owed_tries, c.answer_by nulls first, c.created_at
    loop
        select m.id, m.user_id, m.conversation_id, m.surface, m.sender, m.created_at into v_message
          from public.messages m
         where m.id = v_candidate.id and (m.answer_by is null or m.answer_by <= v_now)
           and not exists (select from public.messages r where r.in_reply_to = m.id)
           and not exists (select from public.stopped_generations s where s.message_id = m.id)
           for update of m skip locked;
        if not found then
            continue;
        end if;
        if v_budgeted and public.turn_budget_until(v_message.user_id, p_turns_per_minute, p_turns_per_day,
                                                   p_tokens_per_day) is not null then
            continue;
        end if;
        update public.messages m
           set answer_by = v_now + make_interval(secs => p_answer_within_seconds), attempt = gen_random_uuid(),
               owed_tries = m.owed_tries + 1
         where m.id = v_message.id
        returning m.attempt, m.owed_tries into v_attempt, v_tries;
        v_claimed := v_claimed || jsonb_build_object('attempt', v_attempt, 'tries', v_tries,
            'user_id', v_message.user_id, 'conversation_id', v_message.conversation_id,
            'conversation_surface', v_message.surface, 'message_id', v_message.id,
            'surface', v_message.surface, 'sender', v_message.sender, 'created_at', v_message.created_at,
            'duplicate', false, 'owed', true, 'reply', null, 'prepend', '[]'::jsonb,
            'history', public.context_window(v_message.user_id, null,
                                             v_message.created_at - make_interval(hours => p_window_hours),
                                             v_message.created_at, v_message.id, p_max_messages, p_window_step),
            'notes', (select n.content from public.memory_notes n
                       where n.user_id = v_message.user_id and n.revision > 0),
            -- the person's clock, which the context's tags are shown on, and their language, which
            -- a fallback is said in (follow_ups.sql)
            'timezone', (select t.timezone from public.person_timezones t where t.user_id = v_message.user_id),
            'language', public.person_language(v_message.user_id, null, null),
            -- held follow-ups an attempt at this WhatsApp message took: said first (follow_ups.sql)
            'delivered_first', case when v_message.surface = 'whatsapp'
                                    then crossmem_private.follow_ups_said_with(v_message.id) end);
        v_count := v_count + 1;
        exit when v_count >= p_limit;
    end loop;
    return v_claimed;
end;
$$;

revoke all on function crossmem_private.redeem_code(text, text, text, integer, boolean) from public, anon, authenticated;
grant execute on function crossmem_private.redeem_code(text, text, text, integer, boolean) to service_role;
revoke all on function public.person_language(uuid, text, text) from public, anon, authenticated;
grant execute on function public.person_language(uuid, text, text) to service_role;
