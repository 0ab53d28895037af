-- A person's data export (the right of access and portability, the twin of forgetting.sql):
-- everything the memory holds of one person, each read filtered by that person's user_id.
-- Who calls it: core/memory/export.py, for `GET /export` (the signed-in person) and
-- `crossmem export --user ID` (the operator). Only service_role executes it (access.sql).

-- One page of the export. Messages come oldest first, in the thread's order (created_at, id), at
-- most p_limit a call, after (p_after_at, p_after_id): a person with 100,000 messages is many
-- short statements, each an index range of messages_by_user_recent, never one answer of
-- everything. The first page (p_after_at null) carries the rest of what is held of the person as
-- "person": their conversations (with when and from which chat or number they last wrote a message
-- the thread does not keep: conversations.sql's unstored_message_at and _from), memory notes,
-- follow-ups (pending and past: no place a turn holds), identities (their own ids, unmasked: they are theirs; with when
-- each opted out of messages, identities.sql's opted_out_at), who was merged into them, their remembered language and
-- time zone, the budget's counts, link codes (never the code's hash) and pending forget requests
-- (never the code). Not exported: bookkeeping that holds no word of theirs (forgotten_deliveries'
-- delivery ids, stopped_generations, the claims and tries of the jobs).
-- Returns {"person"? , "messages": [{"id", "conversation_id", "surface", "role", "content",
-- "created_at", "edited_at", "declined"}], "next": {"at", "id"} | null}: null on the last page.
create or replace function public.export_person(
    p_user_id uuid, p_after_at timestamptz, p_after_id bigint, p_limit integer
) returns jsonb language plpgsql stable set search_path = '' as $$
declare
    v_page jsonb;
    v_count integer;
    v_last_at timestamptz;
    v_last_id bigint;
    v_result jsonb;
begin
    with page as (
        select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at, m.edited_at, m.declined
          from public.messages m
         where m.user_id = p_user_id
           -- one row comparison (no `is null or`), so that it bounds the index's scan
           and (m.created_at, m.id) > (coalesce(p_after_at, '-infinity'), coalesce(p_after_id, 0))
         order by m.created_at, m.id
         limit greatest(p_limit, 1)
    )
    select coalesce(jsonb_agg(jsonb_build_object(
               'id', p.id, 'conversation_id', p.conversation_id, 'surface', p.surface, 'role', p.role,
               'content', p.content, 'created_at', p.created_at, 'edited_at', p.edited_at,
               'declined', p.declined) order by p.created_at, p.id), '[]'::jsonb),
           count(*),
           (array_agg(p.created_at order by p.created_at desc, p.id desc))[1],
           (array_agg(p.id order by p.created_at desc, p.id desc))[1]
      into v_page, v_count, v_last_at, v_last_id
      from page p;
    v_result := jsonb_build_object(
        'messages', v_page,
        'next', case when v_count >= greatest(p_limit, 1)
                     then jsonb_build_object('at', v_last_at, 'id', v_last_id) end);
    if p_after_at is not null then
        return v_result;
    end if;
    return v_result || jsonb_build_object('person', jsonb_build_object(
        'user_id', p_user_id,
        'messages_total', (select count(*) from public.messages m where m.user_id = p_user_id),
        'conversations', (
            select coalesce(jsonb_agg(jsonb_build_object(
                       'id', c.id, 'surface', c.surface, 'title', c.title,
                       'created_at', c.created_at, 'updated_at', c.updated_at,
                       'unstored_message_at', c.unstored_message_at,
                       'unstored_message_from', c.unstored_message_from) order by c.created_at, c.id), '[]')
              from public.conversations c where c.user_id = p_user_id),
        'memory_notes', (
            select jsonb_build_object('content', n.content, 'written_at', n.written_at,
                                      'covered_until', n.covered_until_at)
              from public.memory_notes n where n.user_id = p_user_id),
        'follow_ups', (
            select coalesce(jsonb_agg(jsonb_build_object(
                       'id', f.id, 'conversation_id', f.conversation_id, 'surface', f.surface,
                       'content', f.content, 'due_at', f.due_at, 'timezone', f.timezone,
                       'status', f.status, 'created_at', f.created_at, 'sent_at', f.sent_at)
                       order by f.due_at, f.id), '[]')
              -- a place a turn's schedule tool holds (follow_ups.sql's `reserved`) is no follow-up
              -- yet, nor ever one when its turn died: the list and forgetting's count leave it out too
              from public.follow_ups f where f.user_id = p_user_id and f.status <> 'reserved'),
        'identities', (
            select coalesce(jsonb_agg(jsonb_build_object(
                       'surface', i.surface, 'external_id', i.external_id,
                       'created_at', i.created_at, 'linked_at', i.linked_at, 'opted_out_at', i.opted_out_at)
                       order by i.surface, i.external_id), '[]')
              from public.identities i where i.user_id = p_user_id),
        'merged_from', (
            select coalesce(jsonb_agg(jsonb_build_object('user_id', x.from_user_id, 'merged_at', x.merged_at)
                                      order by x.merged_at, x.from_user_id), '[]')
              from public.merged_people x where x.into_user_id = p_user_id),
        'language', (select l.language from public.person_languages l where l.user_id = p_user_id),
        'timezone', (select t.timezone from public.person_timezones t where t.user_id = p_user_id),
        -- whether they said it (set_timezone), or a web browser sent it (follow_ups.sql's `stated`)
        'timezone_stated', (select t.stated from public.person_timezones t where t.user_id = p_user_id),
        -- The budget keeps a day of counts (expire_usage drops older ones): this is that day.
        'usage', jsonb_build_object(
            'turns', (select count(*) from public.turn_usage u where u.user_id = p_user_id),
            'tokens', (select coalesce(sum(u.tokens), 0) from public.turn_usage u where u.user_id = p_user_id),
            'voice_seconds', (select coalesce(sum(v.seconds), 0) from public.voice_usage v
                               where v.user_id = p_user_id),
            'since', (select min(u.at) from public.turn_usage u where u.user_id = p_user_id)),
        'link_codes', (
            select coalesce(jsonb_agg(jsonb_build_object(
                       'created_at', k.created_at, 'expires_at', k.expires_at, 'used_at', k.used_at,
                       'used_by_surface', k.used_by_surface) order by k.created_at), '[]')
              from public.link_codes k where k.user_id = p_user_id),
        'forget_requests', (
            select coalesce(jsonb_agg(jsonb_build_object('surface', r.surface, 'requested_at', r.requested_at)
                                      order by r.requested_at), '[]')
              from public.forget_requests r where r.user_id = p_user_id)));
end;
$$;
