-- Issue 33: the turn's SQL, cheaper (docs/benchmarks.md, The floor). quoting inlined where it is
-- called (a SQL-standard body); searchable in plpgsql, its plan kept for the session (every message
-- stored computes it); finish_turn and end_attempt call remember_language, rewrite_user_message
-- and settle_turn_tokens only when the turn brought something for them.
create or replace function crossmem_private.quoting(p_quoted text, p_content text) returns text
    language sql immutable parallel safe
    return case when p_quoted is null then p_content else '[replying to: "' || p_quoted || '"] ' || p_content end;

create or replace function crossmem_private.searchable(p_text text) returns tsvector
    language plpgsql immutable parallel safe set search_path = '' as $$
begin
    return pg_catalog.to_tsvector('pg_catalog.simple'::regconfig,
                                  extensions.unaccent('extensions.unaccent'::regdictionary, p_text));
end;
$$;

create or replace function public.finish_turn(
    p_user_id uuid,
    p_user_message_id bigint,
    p_content text,
    p_delivered boolean,
    p_tokens integer,
    p_user_content text,
    p_reserved integer,
    p_reply_id bigint,
    p_language text  -- the language the turn heard, kept as the person's (null: none)
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_reply_id bigint;
begin
    -- Each part only when the turn brought it: a call that would change nothing still costs its
    -- statements (most turns hear no language and rewrite nothing).
    if p_language is not null then
        perform crossmem_private.remember_language(p_user_id, p_language);
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
        insert into public.messages (id, conversation_id, user_id, surface, role, content, in_reply_to, delivered_at)
        overriding system value
        select coalesce(p_reply_id, nextval('public.messages_id_seq')), a.conversation_id, a.user_id, a.surface,
               'assistant', p_content, a.id, case when p_delivered then clock_timestamp() end
          from asked a
        on conflict (in_reply_to) where in_reply_to is not null do nothing
        returning id, conversation_id, user_id
    ), touched as (
        update public.conversations c
           set updated_at = clock_timestamp()
          from stored s
         where c.id = s.conversation_id and c.user_id = s.user_id
    )
    select s.id into v_reply_id from stored s;

    if v_reply_id is not null then
        if p_reserved <> 0 or p_tokens <> 0 then  -- nothing reserved nor spent: nothing to settle
            perform crossmem_private.settle_turn_tokens(p_user_message_id, null, p_reserved, p_tokens);
        end if;
    else
        select r.id into v_reply_id
          from public.messages r
         where r.in_reply_to = p_user_message_id
           and (r.id = p_reply_id or p_reply_id is null and r.content = p_content)
           and (r.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = r.user_id));
        if v_reply_id is null then
            -- another attempt's reply came first: what this one spent counts all the same
            perform crossmem_private.settle_turn_tokens(p_user_message_id, p_user_id, p_reserved, p_tokens);
        end if;
    end if;
    return jsonb_build_object('reply_id', v_reply_id);
end;
$$;

create or replace function public.end_attempt(
    p_user_id uuid, p_user_message_id bigint, p_attempt uuid, p_tokens integer, p_user_content text,
    p_reserved integer, p_language text
) returns jsonb language plpgsql set search_path = '' as $$
declare
    v_owed boolean;
begin
    if p_language is not null then  -- as finish_turn
        perform crossmem_private.remember_language(p_user_id, p_language);
    end if;
    if p_user_content is not null then
        perform public.rewrite_user_message(p_user_id, p_user_message_id, p_user_content);
    end if;
    perform crossmem_private.settle_turn_tokens(p_user_message_id, p_user_id, p_reserved, p_tokens);
    update public.messages m set answer_by = clock_timestamp()
     where m.id = p_user_message_id and m.user_id = p_user_id and m.role = 'user'
       -- only while no later attempt has taken the message over: never two attempts at once
       and m.attempt is not distinct from p_attempt
       and not exists (select from public.messages r where r.in_reply_to = m.id);
    v_owed := found;
    -- The answer this attempt returned (a fallback) said the held follow-ups it took: the next
    -- answer to this message does not say them again.
    update public.follow_ups f set said_with = null
     where f.said_with = p_user_message_id and f.user_id = p_user_id;
    return jsonb_build_object('owed', v_owed);
end;
$$;
