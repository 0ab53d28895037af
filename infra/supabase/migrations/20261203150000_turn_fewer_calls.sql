-- Issue 33: the turn's SQL, cheaper (docs/benchmarks.md, The floor). quoting is inlined where it is
-- called (a SQL-standard body) and searchable keeps its plan for the session (plpgsql): as
-- `language sql` functions with a `set` clause both were planned again at every message stored;
-- settle_turn_tokens returns at once when nothing was reserved nor spent; remember_language reads
-- in one statement; a context window's messages are arrays of their columns (context_window, and
-- turn_context's prepend), not objects.
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

create or replace function crossmem_private.settle_turn_tokens(
    p_message_id bigint, p_user_id uuid, p_reserved integer, p_tokens integer
) returns void language plpgsql set search_path = '' as $$
begin
    if p_reserved = 0 and p_tokens = 0 then
        return;  -- nothing reserved nor spent: the update would change nothing
    end if;
    update public.turn_usage u
       set tokens = crossmem_private.settled(u.tokens, u.reserved, p_reserved, p_tokens),
           reserved = crossmem_private.settled(u.reserved, u.reserved, p_reserved, 0)
     where u.message_id = p_message_id and (p_user_id is null or u.user_id = p_user_id);
end;
$$;

create or replace function crossmem_private.remember_language(p_user_id uuid, p_language text)
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
    insert into public.person_languages (user_id, language) values (v_user, p_language)
    on conflict (user_id) do update set language = excluded.language, updated_at = clock_timestamp();
    return p_language;
end;
$$;

create or replace function public.context_window(
    p_user_id uuid, p_conversation_id uuid, p_since timestamptz, p_until_at timestamptz, p_until_id bigint,
    p_limit integer, p_step integer
) returns json language plpgsql stable set search_path = '' as $$
declare
    v_total integer;
    v_keep integer;
    v_window json;
begin
    select count(*) into v_total
      from public.messages m
     where m.user_id = p_user_id
       and (p_conversation_id is null or m.conversation_id = p_conversation_id)
       and m.created_at >= p_since
       and (m.created_at, m.id) <= (p_until_at, p_until_id);

    v_keep := greatest(public.window_keeps(v_total, p_limit, p_step), 0);

    select coalesce(json_agg(json_build_array(w.id, w.conversation_id, w.surface, w.role, w.content, w.created_at)
                             order by w.created_at, w.id), '[]'::json) into v_window
      from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
              from public.messages m
             where m.user_id = p_user_id
               and (p_conversation_id is null or m.conversation_id = p_conversation_id)
               and m.created_at >= p_since
               and (m.created_at, m.id) <= (p_until_at, p_until_id)
             order by m.created_at desc, m.id desc
             limit v_keep) w;
    return v_window;
end;
$$;

create or replace function crossmem_private.turn_context(
    p_user_id uuid, p_surface text, p_conversation_id uuid,
    p_message_id bigint, p_message_at timestamptz, p_since timestamptz,
    p_window_hours integer, p_max_messages integer, p_window_step integer, p_web_prepend integer,
    out conversation_surface text, out history json, out prepend json, out notes text
) language plpgsql stable set search_path = '' as $$
begin
    prepend := '[]'::json;
    if p_surface = 'web' then
        select c.surface into conversation_surface from public.conversations c where c.id = p_conversation_id;
        history := public.context_window(p_user_id, p_conversation_id, '-infinity', p_message_at, p_message_id,
                                         p_max_messages, p_window_step);
        if conversation_surface = 'web' and p_web_prepend > 0 then
            -- each message as context_window gives it (context.sql)
            select coalesce(json_agg(json_build_array(s.id, s.conversation_id, s.surface, s.role, s.content,
                                                      s.created_at) order by s.created_at, s.id), '[]'::json)
              into prepend
              from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
                      from public.messages m
                      join public.conversations c on c.id = m.conversation_id
                     where m.user_id = p_user_id
                       and c.user_id = p_user_id
                       and c.surface <> 'web'
                       and m.created_at >= p_since
                       and (m.created_at, m.id) <= (p_message_at, p_message_id)
                     order by m.created_at desc, m.id desc
                     limit p_web_prepend) s;
        end if;
    else
        conversation_surface := p_surface;  -- the person's one conversation of it (turn_conversation)
        history := public.context_window(p_user_id, null, p_message_at - make_interval(hours => p_window_hours),
                                         p_message_at, p_message_id, p_max_messages, p_window_step);
    end if;
    select n.content into notes from public.memory_notes n where n.user_id = p_user_id and n.revision > 0;
end;
$$;
