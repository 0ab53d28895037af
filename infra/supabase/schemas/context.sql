-- The context window: what a turn shows the model of a person's thread.

-- The window rule: how many of the latest p_total messages the stepped window shows, at most
-- p_limit; the rest have left it, in steps of p_step at once (a step longer than the window
-- would empty it: the step is at most the window). context_window and the digest read it here;
-- core/turn/context.py's stepped_tail applies it to a history the web client sends, and a test
-- checks the two agree on every case.
create or replace function public.window_keeps(p_total bigint, p_limit integer, p_step integer)
    returns integer language plpgsql immutable set search_path = '' as $$
begin
    return case when p_total <= p_limit then p_total::integer
                else (p_total - ceil((p_total - p_limit)::numeric / greatest(least(p_step, p_limit), 1))
                                * greatest(least(p_step, p_limit), 1))::integer end;
end;
$$;

-- The last `p_limit` messages of a person (or of one conversation) up to and including
-- the message at (p_until_at, p_until_id), not older than p_since, oldest first. The
-- start moves in steps of p_step messages so that consecutive turns share a prefix.
-- json, not jsonb: built as text, it costs half (jsonb_agg and to_jsonb build a binary
-- tree that the answer turns back into text), and every turn reads it. The window is its
-- columns, each an array of the messages' values in order: [ids, conversation_ids, surfaces,
-- roles, contents, created_ats] (core/models.py's COLUMNS and `stored_messages`), `[]` when it
-- is empty. Not an array per message: each array's values are written by one output function
-- looked up once, where an array per message looked up six for every message (the window was
-- a fifth of a turn's database time, its JSON half of that).
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

    -- The rows: one arm for each window, the one not asked for skipped at once (its condition
    -- names no column). Not one statement with `(p_conversation_id is null or m.conversation_id =
    -- p_conversation_id)`: PL/pgSQL keeps one plan of a statement for the session, and that plan,
    -- made not knowing which window it serves, read the rows through a bitmap and sorted them all,
    -- where each arm walks its index in order (225 -> 141 µs a call: docs/benchmarks.md).
    select case when count(*) = 0 then '[]'::json
                else json_build_array(array_agg(w.id), array_agg(w.conversation_id), array_agg(w.surface),
                                      array_agg(w.role), array_agg(w.content), array_agg(w.created_at)) end
      into v_window
      from (select l.* from ((select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
                                from public.messages m
                               where p_conversation_id is null and m.user_id = p_user_id and m.created_at >= p_since
                                 and (m.created_at, m.id) <= (p_until_at, p_until_id)
                               order by m.created_at desc, m.id desc limit v_keep)
                             union all
                             (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
                                from public.messages m
                               where m.conversation_id = p_conversation_id and m.user_id = p_user_id
                                 and m.created_at >= p_since and (m.created_at, m.id) <= (p_until_at, p_until_id)
                               order by m.created_at desc, m.id desc limit v_keep)) l
             order by l.created_at, l.id) w;  -- aggregated in this order: the arrays are oldest first
    return v_window;
end;
$$;
