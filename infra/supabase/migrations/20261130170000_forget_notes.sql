-- Forgetting reaches what was derived from the messages: a forgotten conversation (one, or all
-- of them) takes the person's memory notes with it, and the operator's erasure also takes the
-- budget's counts (turn_usage, which a plain forget keeps a day so it gives no turns back).
-- As in 20261130130000, with those deletions; same signatures, so the grants stand.

create or replace function public.forget_conversations(p_user_id uuid, p_conversation_id uuid default null)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_messages integer;
    v_conversations integer;
begin
    delete from public.forgotten_deliveries f where f.forgotten_at < clock_timestamp() - interval '2 days';
    insert into public.forgotten_deliveries (surface, external_id, user_id)
    select m.surface, m.external_id, m.user_id
      from public.messages m
     where m.user_id = p_user_id
       and (p_conversation_id is null or m.conversation_id = p_conversation_id)
       and m.external_id is not null
       and m.created_at > clock_timestamp() - interval '2 days'
    on conflict do nothing;

    delete from public.messages m
     where m.user_id = p_user_id
       and (p_conversation_id is null or m.conversation_id = p_conversation_id);
    get diagnostics v_messages = row_count;
    delete from public.conversations c
     where c.user_id = p_user_id
       and (p_conversation_id is null or c.id = p_conversation_id);
    get diagnostics v_conversations = row_count;
    -- The notes were written from these messages: they go too, and the next digest writes
    -- them again from whatever remains.
    delete from public.memory_notes n where n.user_id = p_user_id;
    return jsonb_build_object('messages', v_messages, 'conversations', v_conversations);
end;
$$;


create or replace function public.forget_person(p_user_id uuid, p_erase_identities boolean default false)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_forgotten jsonb := public.forget_conversations(p_user_id);
    v_codes integer;
    v_identities integer := 0;
begin
    delete from public.link_codes c where c.user_id = p_user_id;
    get diagnostics v_codes = row_count;
    delete from public.forget_requests r where r.user_id = p_user_id;
    if p_erase_identities then
        update public.link_codes c
           set used_by_external_id = null
          from public.identities i
         where i.user_id = p_user_id
           and c.used_by_surface = i.surface and c.used_by_external_id = i.external_id;
        delete from public.link_attempts a
         using public.identities i
         where i.user_id = p_user_id and a.surface = i.surface and a.external_id = i.external_id;
        delete from public.identities i where i.user_id = p_user_id;
        get diagnostics v_identities = row_count;
        delete from public.merged_people x where x.from_user_id = p_user_id or x.into_user_id = p_user_id;
        delete from public.turn_usage u where u.user_id = p_user_id;
    end if;
    return v_forgotten || jsonb_build_object('link_codes', v_codes, 'identities', v_identities);
end;
$$;
