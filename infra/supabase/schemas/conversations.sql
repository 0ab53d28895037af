-- Conversations: the web has many per person; every other surface has exactly one per person
-- (a unique partial index makes the find-or-create of a turn race-free).
--
-- Who reads and writes the tables of every file here: access.sql.

create table public.conversations (
    id uuid primary key default gen_random_uuid(),
    user_id uuid not null,
    surface public.surface not null,
    title text not null default '',
    created_at timestamptz not null default clock_timestamp(),
    updated_at timestamptz not null default clock_timestamp(),
    -- How many of its messages there are up to and including the one at (counted_at, counted_id),
    -- null when none is counted: where the web's window starts counting the conversation
    -- (context.sql's conversation_length), so that a conversation of months is not read whole at
    -- each turn. A purge or a merge that removes or moves messages sets it back to null.
    counted bigint,
    counted_at timestamptz,
    counted_id bigint,
    -- Whether a message was ever stored in it (its first turn sets it; turn.sql's
    -- turn_conversation): an empty web conversation is one never written in, which a purge of its
    -- old messages does not make it (create_conversation's limit).
    written boolean not null default false,
    -- When the person last wrote in this chat a message the thread does not keep (a chat command,
    -- a notice: an empty message, a place without coordinates), and from which chat or number:
    -- WhatsApp's 24-hour window opens on any message of theirs (follow_ups.sql's
    -- claim_due_follow_ups), and a message of the thread is its own record. Set by
    -- wrote_outside_thread (follow_ups.sql); gone with the conversation when forgotten, and with
    -- the number when it is unlinked (links.sql).
    unstored_message_at timestamptz,
    unstored_message_from text
);
alter table public.conversations enable row level security;  -- who reads what: access.sql

-- Every surface but the web has exactly one conversation per person; the index makes
-- the find-or-create in begin_turn race-free.
create unique index conversations_one_per_secondary_surface
    on public.conversations (user_id, surface) where surface <> 'web';
-- A person's conversations (the web's list sorts the few a person has). Not on updated_at:
-- every turn touches it, and an update that changes no indexed column stays on its page
-- (a HOT update) without a new entry in every index.
create index conversations_by_user on public.conversations (user_id);
-- A person's web conversations never written in: create_conversation counts at most its limit of
-- them, whatever else the person has. Set once a conversation (its first message), never again.
create index conversations_never_written on public.conversations (user_id) where surface = 'web' and not written;


-- A new, empty web conversation (POST /conversations); a first message without a conversation
-- makes its own (turn.sql's turn_conversation). A person may hold at most p_max_empty web
-- conversations never written in (EMPTY_CONVERSATIONS_PER_PERSON; 0: no limit): no turn and no
-- budget counts an empty one, and a script could otherwise fill the table with them. One more
-- answers {"error": "too_many_empty_conversations"} and stores nothing. A conversation whose old
-- messages were purged was written in: it does not count. A person's calls take turns, so two at
-- once cannot both take the last place; the count reads at most p_max_empty index entries.
create or replace function public.create_conversation(p_user_id uuid, p_title text, p_max_empty integer)
    returns jsonb language plpgsql set search_path = '' as $$
declare
    v_conversation jsonb;
begin
    if p_max_empty > 0 then
        perform pg_advisory_xact_lock(hashtextextended('empty conversations/' || p_user_id, 0));
        if (select count(*)
              from (select from public.conversations c
                     where c.user_id = p_user_id and c.surface = 'web' and not c.written
                     limit p_max_empty) e) >= p_max_empty then
            return jsonb_build_object('error', 'too_many_empty_conversations');
        end if;
    end if;
    insert into public.conversations (user_id, surface, title)
         values (p_user_id, 'web', coalesce(p_title, ''))
      returning jsonb_build_object('id', id, 'surface', surface, 'title', title,
                                   'created_at', created_at, 'updated_at', updated_at)
      into v_conversation;
    return v_conversation;
end;
$$;

-- A page of a person's conversations, the latest active first (then by id): at most p_limit of
-- those after the place (p_before_at, p_before_id) in that order (null: from the first). The
-- place is the last listed one's as it was listed: a conversation active since, or forgotten,
-- does not move it.
create or replace function public.list_conversations(p_user_id uuid, p_limit integer, p_before_at timestamptz,
                                                     p_before_id uuid)
    returns jsonb language sql stable set search_path = '' as $$
    select coalesce(jsonb_agg(to_jsonb(c) order by c.updated_at desc, c.id), '[]'::jsonb)
      from (select c.id, c.surface, c.title, c.created_at, c.updated_at
              from public.conversations c
             where c.user_id = p_user_id
               and (p_before_at is null or c.updated_at < p_before_at
                    or c.updated_at = p_before_at and c.id > p_before_id)
             order by c.updated_at desc, c.id
             limit p_limit) c;
$$;
