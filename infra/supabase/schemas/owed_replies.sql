-- Owed replies: a message stored and never answered (its instance died, its web client hung
-- up) is answered once, by its redelivery (begin_turn takes it over) or by the scheduled job
-- for Telegram and WhatsApp, which no platform redelivers for long.

-- The scheduled job's share of owed messages: Telegram's and WhatsApp's (p_surfaces, comma-separated) stored in
-- the last p_max_age_seconds with no reply and no attempt that may still answer, at most p_limit.
-- Each is taken over (`for update skip locked`: overlapping runs share them out) until
-- p_answer_within_seconds from now, its try counted (`owed_tries`), and returned with the context
-- it is answered from, as begin_turn would have returned it, and `tries` (this one included).
--
-- Fair: the people whose owed messages the job has tried least go first (one whose message it
-- could not answer goes behind everyone else), then the messages it has tried least, then the
-- longest owed; p_skip_users (comma-separated) are people the run has already had its share of.
-- A message a later turn of its person's reads owed, merged with its own, is that turn's to answer
-- (finish_turn's p_merged): left while a later message of theirs is being answered, or while their
-- turn is beginning (begin_turn's owed lock), never answered by both.
-- A message whose reply the person stopped (Telegram's stop button, messages.sql) is not owed:
-- they asked for no more of it (docs/decisions.md, Stop means stop).
-- A message whose reply is stored but owed a send (messages.sql's unsent_from: the surface was
-- down when it was written) is claimed alike, with that reply ('reply'), which the job sends from
-- the part it stopped at; it asks no model, so the person's budget does not hold it.
-- Within the budget, as begin_turn takes a redelivery over (turn.sql): in the budget's lock, a
-- person past TURNS_PER_MINUTE or TURNS_PER_DAY, or whose day with the answer's estimated input
-- (turn_input_tokens: p_input_tokens, the system prompt and the tools, and the window and notes)
-- would reach TOKENS_PER_DAY, is left alone, untried, until the budget frees or the message ages
-- out, as their own message would be refused. A message claimed to be answered reserves its
-- answer's tokens (p_requests times its input and p_output_tokens) beside its earlier attempts',
-- returned as 'reserved' for finish_turn or end_attempt to settle.
-- One whose chat or number has opted out (identities.sql's opted_out_at: an SMS number's STOP) is
-- claimed with 'opted_out' true, no context and nothing reserved, whatever the budget: the job asks
-- no model and sends nothing for it, and settles it (give_up_owed).
create or replace function public.claim_owed_replies(
    p_surfaces text, p_max_age_seconds integer, p_answer_within_seconds integer, p_limit integer,
    p_skip_users text, p_turns_per_minute integer, p_turns_per_day integer, p_tokens_per_day integer,
    p_window_hours integer, p_max_messages integer, p_window_step integer,
    -- the answer's reservation, as begin_turn's: what each request reads besides the window and the
    -- notes, the most it writes (ANTHROPIC_MAX_TOKENS), and how many requests it may make
    p_input_tokens integer, p_output_tokens integer, p_requests integer
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_now timestamptz := clock_timestamp();
    v_claimed jsonb := '[]'::jsonb;
    v_count integer := 0;
    v_candidate record;
    v_message record;
    v_attempt uuid;
    v_tries integer;
    v_reply jsonb;
    v_input integer;
    v_reserved integer;
    v_opted_out boolean;
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
                  -- its reply, if any (one at most): a join through the replies' index, where an
                  -- `or exists` was planned as one scan of every message
                  left join public.messages r on r.in_reply_to = m.id and r.user_id = m.user_id
                 where m.role = 'user' and m.sender is not null
                   and m.created_at > v_now - make_interval(secs => p_max_age_seconds)
                   and m.surface = any (string_to_array(p_surfaces, ','))
                   and (m.answer_by is null or m.answer_by <= v_now)
                   -- no reply, nor part of a turn the model declined or answered (turn.sql's
                   -- finish_turn: answered with it), nor edited away on the web's page of its thread
                   -- (messages.sql's replaced: its edit has its own answer); or a reply owed a send
                   and (r.id is null and not m.declined and not m.answered_with_later and not m.replaced
                        or r.unsent_from is not null)
                   -- the person stopped its reply (messages.sql): not wanted, not owed (the draft they
                   -- were shown is its reply, and its rest is sent all the same)
                   and (r.unsent_from is not null
                        or not exists (select from public.stopped_generations s where s.message_id = m.id))
                   and m.user_id::text <> all (string_to_array(p_skip_users, ','))) c
         order by c.person_tries, c.owed_tries, c.answer_by nulls first, c.created_at
    loop
        select m.id, m.user_id, m.conversation_id, m.surface, m.sender, m.created_at, m.reply_id into v_message
          from public.messages m
         where m.id = v_candidate.id and (m.answer_by is null or m.answer_by <= v_now)
           and (not exists (select from public.messages r where r.in_reply_to = m.id and r.user_id = m.user_id)
                and not m.declined and not m.answered_with_later and not m.replaced
                and not exists (select from public.stopped_generations s where s.message_id = m.id)
                or exists (select from public.messages r
                            where r.in_reply_to = m.id and r.user_id = m.user_id and r.unsent_from is not null))
           for update of m skip locked;
        if not found then
            continue;
        end if;
        v_reply := crossmem_private.stored_reply(v_message.id, v_message.user_id);
        -- A turn of the person's is reading or answering their owed messages with a later one of
        -- theirs (merged: turn.sql's begin_turn, its lock): answered there, not twice. It is left
        -- while that turn runs, and is owed no more once it answered (finish_turn's p_merged), or
        -- is claimed once it ended without an answer (its answer_by then passed). A reply owed a
        -- send is no question that turn answers: sent now.
        if v_reply is null
           and (not pg_try_advisory_xact_lock(hashtextextended('owed/' || v_message.user_id, 0))
                or crossmem_private.later_answer_by(v_message.user_id, v_message.created_at, v_message.id, v_now)
                   is not null) then
            continue;
        end if;
        v_opted_out := crossmem_private.opted_out_of(v_message.user_id, v_message.surface) ? v_message.sender;
        v_input := 0;
        v_reserved := 0;
        if v_reply is null and not v_opted_out then
            if p_tokens_per_day > 0 and p_requests > 0 then
                -- the message is in its window: no content of its own
                v_input := crossmem_private.turn_input_tokens(
                    v_message.user_id, v_message.surface, v_message.conversation_id, '',
                    v_message.created_at - make_interval(hours => p_window_hours), p_max_messages, 0, p_input_tokens);
                v_reserved := least(p_requests::bigint * (v_input + greatest(p_output_tokens, 0)), 2000000000);
            end if;
            if crossmem_private.turn_limited_until(
                   v_message.user_id, p_turns_per_minute, p_turns_per_day, p_tokens_per_day,
                   v_input, v_reserved, p_output_tokens) is not null then
                continue;
            end if;
            update public.turn_usage u set tokens = u.tokens + v_reserved, reserved = u.reserved + v_reserved
             where u.message_id = v_message.id;
            if not found then
                v_reserved := 0;  -- stored when no limit was on: nothing to count it in
            end if;
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
            -- whose the chat or number is now (null: nobody's, unlinked or forgotten): an answer goes
            -- only to one that still reaches the message's person (core/turn/owed.py)
            'sender_user', (select i.user_id from public.identities i
                             where i.surface = v_message.surface and i.external_id = v_message.sender),
            'duplicate', false, 'owed', true, 'reply', v_reply, 'prepend', '[]'::jsonb, 'reserved', v_reserved,
            -- the id its answer is stored under: the one its turn named (a web client resuming the
            -- stream is told it; messages.sql's reply_id)
            'reply_id', v_message.reply_id,
            'opted_out', v_opted_out,
            -- a reply to send needs no context, nor one that will not be asked for
            'history', case when v_reply is null and not v_opted_out
                            then public.context_window(v_message.user_id, null,
                                                       v_message.created_at - make_interval(hours => p_window_hours),
                                                       v_message.created_at, v_message.id, p_max_messages,
                                                       p_window_step, null)
                            else '[]'::json end,
            'notes', (select n.content from public.memory_notes n
                       where n.user_id = v_message.user_id and n.revision > 0),
            -- the person's clock, which the context's tags are shown on, and their language, which
            -- a fallback is said in (follow_ups.sql)
            'timezone', (select t.timezone from public.person_timezones t where t.user_id = v_message.user_id),
            -- their pending follow-ups, which the answer's tools read as a turn's (follow_ups.sql)
            'follow_ups', public.follow_ups_of(v_message.user_id),
            'language', public.person_language(v_message.user_id, null, null),
            -- held follow-ups an attempt at this message took, where they wait for a window: said
            -- first (follow_ups.sql)
            'delivered_first', case when public.surface_has_window(v_message.surface)
                                    then crossmem_private.follow_ups_said_with(v_message.id) end);
        v_count := v_count + 1;
        exit when v_count >= p_limit;
    end loop;
    return v_claimed;
end;
$$;

-- An owed message the job will not answer, claimed under p_attempt: its chat or number opted out
-- (claim_owed_replies' 'opted_out'). No longer owed, as a message whose reply the person stopped
-- (stopped_generations, messages.sql: they asked for no more), and its reply owed a send, if it has
-- one, given up (never delivered, kept in the thread as a reply given up is). Nothing is stored in
-- the thread. {"given_up": boolean}: false when the claim no longer holds it.
create or replace function public.give_up_owed(p_user_id uuid, p_message_id bigint, p_attempt uuid)
    returns jsonb language plpgsql set search_path = '' as $$
begin
    perform from public.messages m
     where m.id = p_message_id and m.user_id = p_user_id and m.attempt = p_attempt
       for update of m;
    if not found then
        return jsonb_build_object('given_up', false);
    end if;
    update public.messages r set unsent_from = null
     where r.in_reply_to = p_message_id and r.user_id = p_user_id and r.unsent_from is not null;
    insert into public.stopped_generations (message_id, user_id) values (p_message_id, p_user_id)
        on conflict do nothing;
    update public.messages m set answer_by = clock_timestamp()
     where m.id = p_message_id and m.user_id = p_user_id;
    return jsonb_build_object('given_up', true);
end;
$$;
