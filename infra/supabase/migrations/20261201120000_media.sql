-- Voice notes, photos and documents (issue #20): the turn that fetched, transcribed or looked at
-- what a person sent rewrites their stored message as what it learned, in the round trip that
-- ends the turn. begin_turn stores a placeholder ("[voice note, 0:42, not transcribed]"); a
-- finished turn stores "[voice note, 0:42] the transcript", or "[photo: what it shows] caption";
-- a turn that ended without a reply keeps what it learned too (a transcript survives a model
-- failure). A redelivery finds the message answered and fetches nothing: the download and the
-- transcription are part of the turn's idempotency.
--
-- One change each to finish_turn and end_attempt: a last parameter, p_user_content (null: the
-- message stays as stored), and one statement that writes it. Their signatures change, so they are
-- dropped and created again (a second overload would make every call ambiguous).

create or replace function public.rewrite_user_message(p_user_id uuid, p_user_message_id bigint, p_content text)
returns void
language sql
set search_path = ''
as $$
    update public.messages m set content = p_content
     where p_content is not null and m.id = p_user_message_id and m.role = 'user'
       and (m.user_id = p_user_id
            or exists (select from public.merged_people x
                        where x.from_user_id = p_user_id and x.into_user_id = m.user_id));
$$;

drop function public.finish_turn(uuid, bigint, text, boolean, integer);

-- As in 20261201100000_answered_once.sql, plus rewrite_user_message first.
create function public.finish_turn(
    p_user_id uuid,
    p_user_message_id bigint,
    p_content text,
    p_delivered boolean default true,
    p_tokens integer default 0,
    p_user_content text default null
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_reply_id bigint;
    v_conversation uuid;
    v_owner uuid;
begin
    perform public.rewrite_user_message(p_user_id, p_user_message_id, p_user_content);
    with asked as (
        select m.id, m.conversation_id, m.user_id, m.surface
          from public.messages m
         where m.id = p_user_message_id and m.role = 'user'
           and (m.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = m.user_id))
    ), stored as (
        insert into public.messages (conversation_id, user_id, surface, role, content, in_reply_to, delivered_at)
        select a.conversation_id, a.user_id, a.surface, 'assistant', p_content, a.id,
               case when p_delivered then clock_timestamp() end
          from asked a
        on conflict (in_reply_to) where in_reply_to is not null do nothing
        returning id, conversation_id, user_id
    )
    select s.id, s.conversation_id, s.user_id into v_reply_id, v_conversation, v_owner from stored s;

    if v_reply_id is not null then
        update public.conversations c
           set updated_at = clock_timestamp()
         where c.id = v_conversation and c.user_id = v_owner;
        update public.turn_usage u set tokens = u.tokens + greatest(p_tokens, 0)
         where u.message_id = p_user_message_id;
    else
        select r.id into v_reply_id
          from public.messages r
         where r.in_reply_to = p_user_message_id and r.content = p_content
           and (r.user_id = p_user_id
                or exists (select from public.merged_people x
                            where x.from_user_id = p_user_id and x.into_user_id = r.user_id));
    end if;
    return jsonb_build_object('reply_id', v_reply_id);
end;
$$;

drop function public.end_attempt(uuid, bigint, uuid, integer);

-- As in 20261201100000_answered_once.sql, plus rewrite_user_message first.
create function public.end_attempt(
    p_user_id uuid, p_user_message_id bigint, p_attempt uuid, p_tokens integer, p_user_content text default null
)
returns jsonb
language plpgsql
set search_path = ''
as $$
declare
    v_owed boolean;
begin
    perform public.rewrite_user_message(p_user_id, p_user_message_id, p_user_content);
    update public.turn_usage u set tokens = u.tokens + greatest(p_tokens, 0)
     where u.message_id = p_user_message_id and u.user_id = p_user_id;
    update public.messages m set answer_by = clock_timestamp()
     where m.id = p_user_message_id and m.user_id = p_user_id and m.role = 'user'
       -- only while no later attempt has taken the message over: never two attempts at once
       and m.attempt is not distinct from p_attempt
       and not exists (select from public.messages r where r.in_reply_to = m.id);
    v_owed := found;
    return jsonb_build_object('owed', v_owed);
end;
$$;

revoke all on function
    public.rewrite_user_message(uuid, bigint, text),
    public.finish_turn(uuid, bigint, text, boolean, integer, text),
    public.end_attempt(uuid, bigint, uuid, integer, text)
from public, anon, authenticated;
grant execute on function
    public.rewrite_user_message(uuid, bigint, text),
    public.finish_turn(uuid, bigint, text, boolean, integer, text),
    public.end_attempt(uuid, bigint, uuid, integer, text)
to service_role;
