-- Owed replies: a message stored and never answered (its instance died, its web client hung
-- up) is answered once, by its redelivery (begin_turn takes it over) or by the scheduled job
-- for Telegram and WhatsApp, which no platform redelivers for long.

-- The scheduled job's share of owed messages: Telegram's and WhatsApp's (p_surfaces, comma-separated) stored in
-- the last p_max_age_seconds with no reply and no attempt that may still answer. Each is taken
-- over (`for update skip locked`: overlapping runs share them out) and returned with the context
-- it is answered from, as begin_turn would have returned it.
create or replace function public.claim_owed_replies(
    p_surfaces text, p_max_age_seconds integer, p_answer_within_seconds integer, p_limit integer,
    p_window_hours integer, p_max_messages integer, p_window_step integer
) returns jsonb language plpgsql set search_path = '' as $$
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
         -- the longest owed first: one that just failed again goes behind the others
         order by m.answer_by nulls first, m.created_at
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
                       where n.user_id = v_message.user_id and n.revision > 0),
            -- the person's clock, which the context's tags are shown on (follow_ups.sql)
            'timezone', (select t.timezone from public.person_timezones t where t.user_id = v_message.user_id),
            -- held follow-ups an attempt at this WhatsApp message took: said first (follow_ups.sql)
            'delivered_first', case when v_message.surface = 'whatsapp'
                                    then crossmem_private.follow_ups_said_with(v_message.id) end);
    end loop;
    return v_claimed;
end;
$$;
