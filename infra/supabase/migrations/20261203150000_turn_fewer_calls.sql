-- Issue 33: the turn's SQL, cheaper (docs/benchmarks.md, The floor). quoting is inlined where it is
-- called (a SQL-standard body) and searchable keeps its plan for the session (plpgsql): as
-- `language sql` functions with a `set` clause both were planned again at every message stored;
-- settle_turn_tokens returns at once when nothing was reserved nor spent; remember_language reads
-- in one statement.
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
