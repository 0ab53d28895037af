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
-- start moves in steps of p_step messages so that consecutive turns share a prefix: counted
-- from the first message of the range, of which there are p_total (null: counted here).
-- json, not jsonb: built as text, it costs half (jsonb_agg and to_jsonb build a binary
-- tree that the answer turns back into text), and every turn reads it. The window is its
-- columns, each an array of the messages' values in order: [ids, conversation_ids, surfaces,
-- roles, contents, created_ats] (core/models.py's COLUMNS and `stored_messages`), `[]` when it
-- is empty. Not an array per message: each array's values are written by one output function
-- looked up once, where an array per message looked up six for every message (the window was
-- a fifth of a turn's database time, its JSON half of that). A declined turn's messages
-- (messages.sql's `declined`) are counted and taken, then left out: marking them moves no step
-- (the prefix the prompt cache holds stays the same), and the window never reaches before its
-- start, which the notes cover (memory_notes.sql); it holds that many fewer until it steps. So,
-- in a conversation's window, are the messages an edit replaced and their replies (the page no
-- longer shows them, nor does the history route: conversation_messages). A message other than the
-- turn's own whose own attempt may still answer it (its answer_by to come, and no reply in the
-- window), or answered it after the window's end (after the turn's message: a turn taking that
-- message later, the scheduled job's, a redelivery's), is read marked: a chat's burst ("I'm at the
-- station", then "which train?" before the first answer), another tab's question ("what is the
-- capital of Peru?", then "and of Chile?"). Read apart, the second loses what the first said; read
-- as one turn, both answers answered the first. So the window has a seventh array, the ids of such
-- messages (null when none; the web's prepend has one too, turn.sql's turn_context), which the
-- context shows the model as answered separately (core/turn/context.py): this turn answers what
-- came after, and does not count it as answered (docs/decisions.md). Once its reply is in the
-- window, or once its attempt ended without a reply (owed: answered with this one), it is read as
-- any other.
create or replace function public.context_window(
    p_user_id uuid, p_conversation_id uuid, p_since timestamptz, p_until_at timestamptz, p_until_id bigint,
    p_limit integer, p_step integer, p_total bigint
) returns json language plpgsql stable set search_path = '' as $$
declare
    v_total bigint := p_total;
    v_keep integer;
    v_window json;
begin
    if v_total is null then
        select count(*) into v_total
          from public.messages m
         where m.user_id = p_user_id
           and (p_conversation_id is null or m.conversation_id = p_conversation_id)
           and m.created_at >= p_since
           and (m.created_at, m.id) <= (p_until_at, p_until_id);
    end if;

    v_keep := greatest(public.window_keeps(v_total, p_limit, p_step), 0);

    -- The rows: one arm for each window, the one not asked for skipped at once (its condition
    -- names no column). Not one statement with `(p_conversation_id is null or m.conversation_id =
    -- p_conversation_id)`: PL/pgSQL keeps one plan of a statement for the session, and that plan,
    -- made not knowing which window it serves, read the rows through a bitmap and sorted them all,
    -- where each arm walks its index in order (225 -> 141 µs a call: docs/benchmarks.md).
    select case when count(*) = 0 then '[]'::json
                else json_build_array(array_agg(w.id), array_agg(w.conversation_id), array_agg(w.surface),
                                      array_agg(w.role), array_agg(w.content), array_agg(w.created_at),
                                      array_agg(w.id) filter (where w.answering)) end
      into v_window
      from (with l as ((select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at,
                                     m.declined, m.replaced, m.in_reply_to, m.answer_by
                                from public.messages m
                               where p_conversation_id is null and m.user_id = p_user_id and m.created_at >= p_since
                                 and (m.created_at, m.id) <= (p_until_at, p_until_id)
                               order by m.created_at desc, m.id desc limit v_keep)
                             union all
                             (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at,
                                     m.declined, m.replaced, m.in_reply_to, m.answer_by
                                from public.messages m
                               where m.conversation_id = p_conversation_id and m.user_id = p_user_id
                                 and m.created_at >= p_since and (m.created_at, m.id) <= (p_until_at, p_until_id)
                               order by m.created_at desc, m.id desc limit v_keep))
            , a as (select l.*,
                           -- its own attempt may still answer it (above): its reply, stored since, follows it
                           -- here; or that reply is stored after the window's end (after the turn's message,
                           -- which the scheduled job or a redelivery answers once the first's time is up):
                           -- read as answered, it would be merged here and answered again
                           coalesce(l.role = 'user' and l.id <> p_until_id
                                    and l.id not in (select r.in_reply_to from l r where r.in_reply_to is not null)
                                    and (l.answer_by > now()
                                         or exists (select from public.messages r
                                                     where r.in_reply_to = l.id and r.user_id = p_user_id)),
                                    false) as answering
                      from l)
            select l.* from a l
             where not l.declined  -- after the limit: the window starts where its step says
               -- a conversation's window is its page's thread (web_items): what an edit replaced there,
               -- and the replies to those in the window, are off the page (messages.sql's replaced),
               -- kept for search and the digest. Replies are matched within the window, no lookup
               -- more: one whose message has left it is its first row (core/turn/context.py's
               -- from_their_first leaves it out unless other apps' messages come before it)
               and (p_conversation_id is null or l.id = p_until_id
                    or not (l.replaced or (l.in_reply_to is not null
                                           and l.in_reply_to in (select r.id from l r where r.replaced))))
             order by l.created_at, l.id) w;  -- aggregated in this order: the arrays are oldest first
    return v_window;
end;
$$;

-- How many messages a conversation holds up to and including the one at (p_until_at, p_until_id)
-- (`total`), for the web's window, which counts a conversation from its first message; and a time
-- its window's rows are all at or after (`since`). Counting every message read a conversation of
-- months whole at every turn (about 0.9 ms at 5,000 messages), and so did reading its rows when
-- the planner, taking the conversation for an average one, read them all and sorted them. The
-- conversation keeps a count up to one of its messages (conversations.sql's `counted`), and only
-- the messages after it are counted here. Once there are more than p_limit + p_step of those, the
-- mark moves to the one before the p_limit newest, so a web turn counts at most p_limit + p_step + 2
-- rows (and, in a chat the web opens now and then, what was said there since), whatever the
-- conversation's length, and writes the mark once in about p_step / 2 turns; while at least
-- p_limit messages follow the mark, the window (at most p_limit) is among them. The count and the
-- new mark are read in one statement (one snapshot: a reply committed in between would shift one
-- and not the other), and the mark is written only over the one this turn read: a purge's or a
-- merge's reset (null: counted whole once more) and another turn's move win. A mark past the
-- message (an owed one answered late) is not used.
create function crossmem_private.conversation_length(
    p_user_id uuid, p_conversation_id uuid, p_until_at timestamptz, p_until_id bigint, p_limit integer,
    p_step integer, out total bigint, out since timestamptz
) language plpgsql set search_path = '' as $$
declare
    v_counted bigint;
    v_at timestamptz;
    v_id bigint;
    v_from_at timestamptz := '-infinity';
    v_from_id bigint := 0;
    v_base bigint := 0;
    v_after bigint;
    v_mark_at timestamptz;
    v_mark_id bigint;
begin
    select c.counted, c.counted_at, c.counted_id into v_counted, v_at, v_id
      from public.conversations c
     where c.id = p_conversation_id and c.user_id = p_user_id;
    if v_counted is not null and (v_at, v_id) <= (p_until_at, p_until_id) then
        v_base := v_counted; v_from_at := v_at; v_from_id := v_id;
    end if;
    -- the count and the new mark in one statement: one snapshot
    with n as (select count(*) as after
                 from public.messages m
                where m.conversation_id = p_conversation_id and m.user_id = p_user_id
                  and (m.created_at, m.id) > (v_from_at, v_from_id)
                  and (m.created_at, m.id) <= (p_until_at, p_until_id))
    select n.after, k.created_at, k.id into v_after, v_mark_at, v_mark_id
      from n left join lateral (
           select m.created_at, m.id from public.messages m
            where n.after > p_limit + p_step
              and m.conversation_id = p_conversation_id and m.user_id = p_user_id
              and (m.created_at, m.id) <= (p_until_at, p_until_id)
            order by m.created_at desc, m.id desc offset p_limit limit 1) k on true;
    total := v_base + v_after;
    if v_mark_id is not null then
        -- only over the mark this turn read: a purge's or a merge's reset, or another turn's move, wins
        update public.conversations c
           set counted = total - p_limit, counted_at = v_mark_at, counted_id = v_mark_id
         where c.id = p_conversation_id and c.user_id = p_user_id
           and c.counted is not distinct from v_counted and c.counted_at is not distinct from v_at
           and c.counted_id is not distinct from v_id;
        v_from_at := v_mark_at;
        v_after := p_limit;
    end if;
    since := case when v_after >= p_limit then v_from_at else '-infinity' end;
end;
$$;

-- The latest p_limit messages of the person's chats (their conversations of every surface but the
-- web, and but p_except: the chat's thread a web page is in, whose window the turn reads already)
-- since p_since, up to and including the one at (p_until_at, p_until_id), newest first: what a
-- web turn puts before its conversation (turn.sql's turn_context), and what its budget estimates
-- it at (turn_input_tokens). The latest of each chat (one conversation a surface), then the latest
-- of those: not the person's messages filtered by their conversation, which read a day of their
-- web messages to find none. A declined turn's messages are taken, then left out (context_window);
-- `answering`: one whose own attempt may still answer it, which the web turn reads marked
-- (context_window: a question still being answered on the chat app).
create function crossmem_private.chats_latest(
    p_user_id uuid, p_since timestamptz, p_until_at timestamptz, p_until_id bigint, p_limit integer,
    p_except uuid
) returns table (id bigint, conversation_id uuid, surface public.surface, role text, content text,
                 created_at timestamptz, answering boolean)
    language plpgsql stable set search_path = '' as $$
begin
    return query
    with t as (select l.*
                 from public.conversations c
                cross join lateral (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at,
                                           m.declined, m.answer_by, m.in_reply_to
                                      from public.messages m
                                     where m.conversation_id = c.id and m.user_id = p_user_id and m.created_at >= p_since
                                       and (m.created_at, m.id) <= (p_until_at, p_until_id)
                                     order by m.created_at desc, m.id desc
                                     limit p_limit) l
                where c.user_id = p_user_id and c.surface <> 'web' and c.id is distinct from p_except
                order by l.created_at desc, l.id desc
                limit p_limit)
    select t.id, t.conversation_id, t.surface, t.role, t.content, t.created_at,
           -- its reply, stored since, follows it here; or is stored after the web message (as
           -- context_window's: that message answered again, the other's time up)
           coalesce(t.role = 'user'
                    and t.id not in (select r.in_reply_to from t r where r.in_reply_to is not null)
                    and (t.answer_by > now()
                         or exists (select from public.messages r where r.in_reply_to = t.id and r.user_id = p_user_id)),
                    false)
      from t
     where not t.declined  -- after the limit, as context_window's
     order by t.created_at desc, t.id desc;
end;
$$;
