-- Messages: every message of every surface, one row each, in the order (created_at, id).
--
-- user_id is denormalised from the conversation for the hot index and for row-level security.
-- A user message carries `answer_by`: until then its attempt may still answer (the surface's
-- model deadline plus a margin); after it, or once its attempt is known to have ended
-- (end_attempt), a message with no reply is owed (owed_replies.sql). `sender` keeps the chat
-- or number it came from, so the scheduled job knows where to answer, and `owed_tries` how often
-- the job has tried.
--
-- `search_text` is what memory search reads (search_memory, below): every message a person
-- ever wrote or was answered, on every surface, found by its words.
--
-- Corrections and replies (turn.sql's edit_message and reply_quote; docs/decisions.md): a user
-- message keeps the platform's own name for it (`platform_ref`), which an edit or a reply names
-- it by; a reply keeps the stored message it answers (`replied_to`, when it is the person's) and
-- the text it quotes (`quoted`), which its content begins with; an edit replaces the content
-- and keeps when the platform says it was made (`edited_at`).

-- Supabase keeps extensions in their own schema, there already (the local stand-ins make it, and
-- grant it as Supabase does, on plain Postgres).
create schema if not exists extensions;
create extension if not exists unaccent with schema extensions;
create extension if not exists btree_gin with schema extensions;
create schema if not exists crossmem_private;

-- A text's words as search reads them: unaccented and lower-cased, neither stemmed nor stripped
-- of stopwords (the `simple` configuration), so Spanish, English and any other language are
-- stored alike, without guessing which one a message is in (docs/benchmarks.md, Memory search:
-- the configurations compared). Immutable, as a generated column needs: the dictionary and the
-- configuration are named, never looked up through a search_path. plpgsql, which keeps its
-- expression's plan for the session: every message stored computes it, and a `language sql`
-- body (never inlined: unaccent is only stable) was planned again each time (59 µs against 22).
-- The parser keeps a link, a number after a hyphen and a number with a thousands separator as one
-- word each (`www.booking.com`, `-0142`, `1.250`): a text that holds one is read once more with
-- them apart (`booking`, `0142`) and its thousands joined (`1250`), so a word or the digits inside
-- one are found (a review's finding: "the booking link", "0142", "1250" found nothing).
-- Japanese and Chinese write no space between words, and Korean none before a particle, so the
-- parser reads a whole run of them as one word: a text that holds them is read once more as each
-- run's overlapping pairs of letters (`東京に行く`: 東京 京に に行 行く), which a question's own pairs
-- find, as a CJK bigram analyzer does (a review's finding: "東京" found nothing in "東京に行きます"),
-- and with its runs taken out, so that a word of another alphabet inside one is a word
-- ("MacBook" in "修理に出したMacBookは"). Only its first 5,000 characters are read so: the pairs of a
-- pasted document of 200,000 took its words past a tsvector's megabyte, and it could not be stored.
create function crossmem_private.searchable(p_text text) returns tsvector
    language plpgsql immutable parallel safe set search_path = '' as $$
declare
    v_text constant text := extensions.unaccent('extensions.unaccent'::regdictionary, p_text);
    v_words tsvector := pg_catalog.to_tsvector('pg_catalog.simple'::regconfig, v_text);
    -- kanji, kana, hangul (and 々, kanji's repeat mark)
    v_cjk constant text := '[\u3005\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]';
begin
    if v_text ~ '[[:alnum:]][./:_-][[:alnum:]]' then
        v_words := v_words
            || pg_catalog.to_tsvector('pg_catalog.simple'::regconfig,
                                      pg_catalog.regexp_replace(
                                          pg_catalog.regexp_replace(v_text, '([0-9])[.,]([0-9]{3})(?![0-9])', '\1\2', 'g'),
                                          '[./:_-]+', ' ', 'g'));
    end if;
    if v_text ~ v_cjk then
        v_words := v_words || pg_catalog.to_tsvector('pg_catalog.simple'::regconfig, (
            select coalesce(pg_catalog.string_agg(pg_catalog.substr(r.run[1], i, 2), ' '), '')
              from pg_catalog.regexp_matches(pg_catalog.left(v_text, 5000), v_cjk || '{2,}', 'g') r(run)
             cross join lateral pg_catalog.generate_series(1, pg_catalog.char_length(r.run[1]) - 1) i))
            -- and a word of another alphabet inside a run as a word of its own (`MacBookは`)
            || pg_catalog.to_tsvector('pg_catalog.simple'::regconfig,
                                      pg_catalog.regexp_replace(pg_catalog.left(v_text, 5000), v_cjk || '+', ' ', 'g'));
    end if;
    return v_words;
end;
$$;

create table public.messages (
    id bigint generated always as identity primary key,
    conversation_id uuid not null references public.conversations (id) on delete cascade,
    user_id uuid not null,
    surface public.surface not null,
    role text not null check (role in ('user', 'assistant')),
    content text not null check (char_length(content) between 1 and 200000),
    -- Telegram update_id, Twilio MessageSid, web client message id.
    external_id text,
    -- An assistant reply points at the user message it answers: one reply per message.
    in_reply_to bigint references public.messages (id) on delete cascade,
    -- When the reply reached the person; null while a surface still owes it.
    delivered_at timestamptz,
    -- A reply stored before all of it reached the person, for a reason that may pass (the surface
    -- down, a later part refused after the ones before it went out): its first part not yet sent
    -- (0: none was), which a redelivery or the scheduled job sends from, once (owed_replies.sql);
    -- null once it is delivered or given up, and on every other row.
    unsent_from smallint check (unsent_from >= 0),
    created_at timestamptz not null default clock_timestamp(),
    -- The begin_turn call that stored it (a random token): the same call retried after its
    -- connection died recognises its own message and is not a redelivery.
    attempt uuid,
    answer_by timestamptz,
    sender text,
    -- How many times the scheduled job has taken it over (owed_replies.sql): its later tries go
    -- behind the messages it has tried less, and past OWED_REPLY_MAX_TRIES it gets the fallback.
    owed_tries smallint not null default 0,
    -- Telegram "chat_id:message_id", Twilio's MessageSid: an edit has a delivery of its own
    -- (a new update_id) but names the message it corrects this way.
    platform_ref text,
    replied_to bigint references public.messages (id) on delete set null,
    quoted text,
    edited_at timestamptz,
    -- The model declined the turn (its stop reason `refusal`): the reply that said so, the person's
    -- message and what the turn merged with it (turn.sql's mark_declined) are marked, kept and
    -- shown, and left out of every later context, as Anthropic asks (a conversation that goes on
    -- with the refused turn in it is refused again).
    declined boolean not null default false,
    -- A person's message with no reply of its own that a later turn merged into its last turn and
    -- answered (turn.sql's finish_turn: its attempt had ended, the fallback sent, say): answered with
    -- that reply, so owed to nobody, neither the scheduled job nor its redelivery answers it again.
    answered_with_later boolean not null default false,
    -- A person's message: the id its reply is stored under, drawn when it is stored (turn.sql's
    -- store_user_message), so that every attempt at it names the same reply (the web's stream
    -- resumed after a dropped connection shows the reply it began, not a second one).
    reply_id bigint,
    -- A person's message a later edit of it replaced on the page (useChat's edit, docs/decisions.md),
    -- or a web message that followed the one edited (the page drops it with the edit): kept, as said,
    -- for memory; out of the page's listing, with its reply (conversation_messages),
    -- so a reloaded page reads the thread it showed (replace_message).
    replaced boolean not null default false,
    search_text tsvector generated always as (crossmem_private.searchable(content)) stored
);
alter table public.messages enable row level security;  -- who reads what: access.sql

-- The hot query: a person's recent messages across all conversations.
create index messages_by_user_recent
    on public.messages (user_id, created_at desc, id desc);
create index messages_by_conversation_recent
    on public.messages (conversation_id, created_at desc, id desc);
-- A conversation is one person's: its messages' user_id follows from their conversation_id. Told
-- so, the planner does not take a filter on both for a filter on two independent columns (one
-- row where there are dozens), which made the web's window (context.sql) read a conversation's
-- rows through a bitmap and sort them all for the latest.
create statistics messages_person_of_conversation (dependencies) on conversation_id, user_id from public.messages;
create unique index messages_one_reply
    on public.messages (in_reply_to) where in_reply_to is not null;
-- The reference a reply keeps: deleting a message (a purge, forgetting) sets its replies' to null,
-- and without this index each deleted row would scan the whole table for them.
create index messages_replies_to on public.messages (replied_to) where replied_to is not null;
-- A begin_turn call's own message, when its delivery has no key (turn.sql's stored_delivery): one
-- with a key is found by it, and its attempt read there, so the index keeps only the others.
create unique index messages_once_per_attempt on public.messages (attempt)
    where attempt is not null and external_id is null;
-- A delivery's key is (person, surface, external_id). Telegram's update_id and Twilio's
-- MessageSid are unique for the whole bot, so per person is the same thing for them; the
-- web's client_message_id means something only to the person who chose it. The same rule is
-- the "already stored" answer and the budget's exemption: a key seen before never reaches
-- the model again, whatever conversation it names. Replies have no key: they are not in it.
create unique index messages_once_per_delivery on public.messages (user_id, surface, external_id)
    where external_id is not null;
-- An edit or a reply finds the person's message by the platform's name for it.
create index messages_by_platform_ref on public.messages (user_id, surface, platform_ref)
    where platform_ref is not null;
-- Memory search: a person's messages by their words (btree_gin puts user_id in the same index,
-- so a search reads only that person's entries, as a Citus shard would hold them).
create index messages_by_user_words on public.messages using gin (user_id, search_text);
-- The purge reads messages by age, in bounded batches.
create index messages_by_age on public.messages (created_at, id);
-- What the owed-replies job scans: unanswered user messages of the last minutes, by age.
create index messages_owed on public.messages (created_at) where role = 'user' and sender is not null;


-- One conversation's messages, newest page first when paging back with p_before_id (the
-- messages before that one in the order of every message, (created_at, id): a reply's id is
-- drawn when its turn begins, so a message stored meanwhile has a higher id and comes before it;
-- a cursor since forgotten pages by its id alone); each page is returned oldest first. The
-- person's web messages carry their client's key (`client_id`): sent again under it, one is
-- stored once (messages_once_per_delivery), where its stored id would be a new message's key.
create or replace function public.conversation_messages(
    p_user_id uuid,
    p_conversation_id uuid,
    p_before_id bigint,
    p_limit integer
) returns jsonb language plpgsql stable set search_path = ''
  -- Taking a conversation for an average one (a few dozen messages), a plan read the whole of it
  -- through a bitmap and sorted it to keep a page (50 to 90 ms at 100,000 messages): the page is
  -- the conversation's index walked from the cursor down, stopped at the page's end.
  set enable_bitmapscan = off as $$
declare
    v_conversation record;
    -- The page ends before the cursor's place; a cursor since forgotten pages by its id alone.
    v_before_at timestamptz := 'infinity';
    v_before bigint := 9223372036854775807;
    v_below_id bigint;
begin
    select c.id, c.surface, c.title, c.created_at, c.updated_at into v_conversation
      from public.conversations c where c.id = p_conversation_id and c.user_id = p_user_id;
    if v_conversation.id is null then
        return jsonb_build_object('error', 'conversation_not_found');
    end if;
    if p_before_id is not null then
        select b.created_at, b.id into v_before_at, v_before
          from public.messages b
         where b.id = p_before_id and b.conversation_id = p_conversation_id and b.user_id = p_user_id;
        if not found then
            v_before_at := 'infinity';
            v_before := 9223372036854775807;
            v_below_id := p_before_id;
        end if;
    end if;
    return jsonb_build_object(
        'conversation', jsonb_build_object('id', v_conversation.id, 'surface', v_conversation.surface,
                                           'title', v_conversation.title, 'created_at', v_conversation.created_at,
                                           'updated_at', v_conversation.updated_at),
        'messages', (
            select coalesce(jsonb_agg(to_jsonb(p) order by p.created_at, p.id), '[]'::jsonb)
              from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at, m.declined,
                           -- the key a web client sent its message with (useChat's id for it)
                           case when m.role = 'user' and m.surface = 'web' then m.external_id end as client_id
                      from public.messages m
                     where m.conversation_id = p_conversation_id and m.user_id = p_user_id
                       and not m.replaced
                       and not exists (select from public.messages q
                                        where q.id = m.in_reply_to and q.user_id = p_user_id and q.replaced)
                       and (m.created_at, m.id) < (v_before_at, v_before)
                       and (v_below_id is null or m.id < v_below_id)
                     order by m.created_at desc, m.id desc
                     limit p_limit) p));
end;
$$;

-- The ids of p_user_id's versions of the message sent under p_key in the conversation of their
-- stored version p_message_id: the message and its edits (an edit's key: its message's, `~` and
-- 16 hex digits, ui_chat_routes.py's edited).
create function crossmem_private.message_versions(p_user_id uuid, p_message_id bigint, p_key text)
    returns setof bigint language sql stable set search_path = '' as $$
    select m.id
      from public.messages m
      join public.messages e on e.id = p_message_id and e.user_id = p_user_id
     where m.user_id = e.user_id and m.surface = e.surface and m.conversation_id = e.conversation_id
       and m.role = 'user'
       and left(m.external_id, length(p_key)) = p_key
       and substr(m.external_id, length(p_key) + 1) ~ '^(~[0-9a-f]{16})*$';
$$;

-- The page edited the message it sent under p_key (useChat's id, or a stored message's key) and
-- the version it shows is stored (p_message_id: an edit, keyed `<p_key>~<digest of its words>`,
-- or a version stored before, the words put back): the message's other versions in its
-- conversation (itself and its edits, `<p_key>~<digest>`; never another key that begins so,
-- "u-10" or "u-1~2") are replaced, out of the page's listing, and that one is listed. Only
-- p_user_id's. Idempotent; the version posted last is the one listed (a live tab's edit back to
-- earlier words; another tab's too): the versions are locked first, in order, and then read
-- again, so that two tabs' calls at once (each after its own edit was stored) never replace
-- each other's edit and every version with it. What followed the message there when it was
-- edited went from the page with the edit (useChat drops it): it is replaced too, for good (the
-- page never shows it again, edited back or not), but for the replies to the message's versions,
-- which come and go with them. A reloaded page listed it before the edit, and its next turn read it
-- as the page's thread. That is all that followed its first version, not only what came before the
-- version shown: edited back to earlier words, the page drops what followed the edit it leaves.
-- Only what was said on the web: another app's messages (the [Telegram] thread's, written on the
-- phone after the page was loaded, which it may never have shown) are that app's, and stay listed.
-- Nor what another page of the web (a second tab, the phone) said while a version was still being
-- answered, with its reply: a page sends its next message once its last one's answer is in
-- (useChat's requests run one at a time, the demo page's Send waits), so a message stored between a
-- version and that version's reply was not sent from the page that edits it, and that other page
-- still shows it (docs/decisions.md). What another page said after the reply is not told apart.
create or replace function public.replace_message(p_user_id uuid, p_message_id bigint, p_key text) returns void
    language sql set search_path = '' as $$
    select m.id from public.messages m
     where m.id in (select crossmem_private.message_versions(p_user_id, p_message_id, p_key))
     order by m.id
       for update of m;
    update public.messages m set replaced = m.id <> p_message_id
     where m.id in (select crossmem_private.message_versions(p_user_id, p_message_id, p_key))
       and m.replaced = (m.id = p_message_id);
    with versions as (
        select v.id, v.conversation_id, v.created_at from public.messages v
         where v.id in (select crossmem_private.message_versions(p_user_id, p_message_id, p_key))
    ), first as (select f.* from versions f order by f.created_at, f.id limit 1
    ), elsewhere as (
        -- said on another page while a version awaited its reply (above)
        select o.id from public.messages o
          join versions v on o.conversation_id = v.conversation_id and (o.created_at, o.id) > (v.created_at, v.id)
          join public.messages r on r.in_reply_to = v.id and r.user_id = p_user_id
         where o.user_id = p_user_id and o.role = 'user' and (o.created_at, o.id) < (r.created_at, r.id)
           and o.id not in (select w.id from versions w)
    )
    update public.messages m set replaced = true
      from first f, versions s
     where s.id = p_message_id
       and m.conversation_id = f.conversation_id and m.user_id = p_user_id and not m.replaced
       and m.surface = 'web' and (m.created_at, m.id) > (f.created_at, f.id)
       and m.id not in (select v.id from versions v)
       and (m.in_reply_to is null or m.in_reply_to not in (select v.id from versions v))
       and m.id not in (select e.id from elsewhere e)
       and (m.in_reply_to is null or m.in_reply_to not in (select e.id from elsewhere e));
$$;

-- The newest message of one of the person's conversations when it is their web message and
-- nothing answers it yet (its turn still running, or left by a client that went away): the
-- web's resume route (functions/ui_chat_routes.py) sends it again by its client's id, which answers it
-- once (begin_turn: the stored reply, a wait for the running attempt, or a new one). Messages an
-- edit replaced (replace_message) are off the page and passed over: an edit stopped and then
-- edited back is never answered below the reply the page shows. The page's edit of another app's
-- message is one of its web messages too (ui_chat_routes.py: stored under that app's surface, with
-- no chat to answer later, `sender`, which the scheduled job needs): nothing else answers it. That
-- app's own messages are the job's.
create or replace function public.unanswered_message(p_user_id uuid, p_conversation_id uuid)
    returns jsonb language sql stable set search_path = '' as $$
    select case when c.id is null then jsonb_build_object('error', 'conversation_not_found')
           else jsonb_build_object('message', (
               select jsonb_build_object('id', n.id, 'surface', n.surface, 'external_id', n.external_id,
                                         'content', n.content)
                 from (select m.id, m.role, m.surface, m.external_id, m.content, m.declined, m.sender
                         from public.messages m
                        where m.conversation_id = c.id and m.user_id = p_user_id and not m.replaced
                        order by m.created_at desc, m.id desc
                        limit 1) n
                where n.role = 'user' and (n.surface = 'web' or n.sender is null) and n.external_id is not null
                  and not n.declined
                  and not exists (select from public.messages r where r.in_reply_to = n.id)))
           end
      from (select 1) one
      left join public.conversations c on c.id = p_conversation_id and c.user_id = p_user_id;
$$;

-- The person's web messages in one of their conversations by the keys their client sent them
-- with (useChat's ids; p_client_ids a JSON array), as a JSON object keyed by them: a page's thread
-- names its earlier messages so, and the turn reads them as stored (a voice note's transcript, a
-- photo's description) and by their ids (search leaves them out). Another person's message
-- under the same key is never one of them. One index read per key (messages_once_per_delivery).
create or replace function public.web_messages_by_client_id(p_user_id uuid, p_conversation_id uuid,
                                                            p_client_ids text)
    returns jsonb language sql stable set search_path = '' as $$
    select coalesce(jsonb_object_agg(m.external_id, jsonb_build_object(
               'id', m.id, 'conversation_id', m.conversation_id, 'surface', m.surface, 'role', m.role,
               'content', m.content, 'created_at', m.created_at)), '{}'::jsonb)
      from public.messages m
     where m.user_id = p_user_id and m.surface = 'web'
       and m.external_id in (select jsonb_array_elements_text(p_client_ids::jsonb))
       and m.conversation_id = p_conversation_id and m.role = 'user';
$$;

-- The key one of the person's own messages in one of their conversations was stored under, by its
-- stored id, and its words: {"message": {"surface", "external_id", "content", "first"}}, its message null when there is no such message
-- of theirs there (or one with no key). The web's useChat sends a message the history route gave no
-- client id (another app's: a Telegram one) under its stored id; sent under this key, it is that
-- message sent again. "first": when its key may be an edit's (`~` and 16 hex digits), the words
-- stored under that key without them (the message it may be an edit of; ui_chat_routes.py's
-- first_key tells), which an edit back to them puts back; else null.
create or replace function public.message_delivery(p_user_id uuid, p_conversation_id uuid, p_message_id bigint)
    returns jsonb language sql stable set search_path = '' as $$
    select jsonb_build_object('message', (
        select jsonb_build_object('surface', m.surface, 'external_id', m.external_id, 'content', m.content,
                                  'first', (select f.content
                                              from public.messages f
                                             where m.external_id ~ '.~[0-9a-f]{16}$' and f.user_id = p_user_id
                                               and f.surface = m.surface and f.external_id = left(m.external_id, -17)
                                               and f.conversation_id = m.conversation_id and f.role = 'user'))
          from public.messages m
         where m.id = p_message_id and m.user_id = p_user_id and m.conversation_id = p_conversation_id
           and m.role = 'user' and m.external_id is not null));
$$;

-- A person's latest messages over every conversation, oldest first (the CLI's history).
create or replace function public.person_history(p_user_id uuid, p_limit integer)
    returns jsonb language sql stable set search_path = '' as $$
    select coalesce(jsonb_agg(to_jsonb(h) order by h.created_at, h.id), '[]'::jsonb)
      from (select m.id, m.conversation_id, m.surface, m.role, m.content, m.created_at
              from public.messages m
             where m.user_id = p_user_id
             order by m.created_at desc, m.id desc
             limit p_limit) h;
$$;


-- Memory search: the person's own messages, every surface and all time, by their words.
--
-- A question as a person asks it ("when did I go to the support group?") is not a keyword
-- query: its words are ranked, not all required. English and Spanish stopwords are dropped from
-- the query (never from what is stored), a word of four letters or more also finds its other
-- endings ("arrives" finds "arrived", "restaurant" finds "restaurante"), and each message scores
-- as BM25 scores it: the rarity of the words it shares with the question among the person's own
-- messages ("the dentist" ranks by "dentist"), more for a short message than a long one. Recency
-- breaks near-ties. docs/benchmarks.md compares
-- this with the other configurations on the recall bench.
create text search dictionary crossmem_private.english_stopwords (
    template = pg_catalog.simple, stopwords = english, accept = false);
create text search dictionary crossmem_private.spanish_stopwords (
    template = pg_catalog.simple, stopwords = spanish, accept = false);

-- The query's words: searchable, distinct, neither a stopword nor a single character; at most the
-- 16 longest (the rarer, as a rule; of a Japanese question's pairs of letters, those with the
-- fewest hiragana, the kana its grammar is written in). A question of a thousand characters had some 140, whose `or`
-- the planner took for most of the table: it read every message of everyone's (2.5 s at 300,000),
-- and anyone may send one. Spanish's stopwords are dropped from a question that reads Spanish: one
-- holding a Spanish stopword that is neither an English stopword nor an English word or name too
-- ("son", "sea", "Sean", "era", "sin", "Al", "Les"...: "what did Sean say about my son?" searched
-- "say" alone, "what is Al's number?" "number" alone). Spanish's
-- list writes 84 of its words with their accents ("más", "también", "tenía"); a phone types them
-- without, and the question's words are compared without, so they are listed here as typed so.
create function crossmem_private.search_terms(p_query text) returns text[]
    language plpgsql stable set search_path = '' as $$
declare
    v_unaccented constant text[] := '{eramos,estabamos,estais,estan,estara,estaran,estaras,estare,estareis,estaria,
        estariais,estariamos,estarian,estarias,esteis,esten,estes,estuvieramos,estuviesemos,fueramos,fuesemos,habeis,
        habia,habiais,habiamos,habian,habias,habra,habran,habras,habre,habreis,habria,habriais,habriamos,habrian,
        habrias,hayais,hubieramos,hubiesemos,mas,mia,mias,mio,mios,seais,sera,seran,seras,sere,sereis,seria,seriais,
        seriamos,serian,serias,si,tambien,tendra,tendran,tendras,tendre,tendreis,tendria,tendriais,tendriamos,tendrian,
        tendrias,teneis,tengais,tenia,teniais,teniamos,tenian,tenias,tuvieramos,tuviesemos}';
    v_reads_spanish constant boolean := exists (
        select from unnest(pg_catalog.tsvector_to_array(crossmem_private.searchable(p_query))) a
         where (pg_catalog.ts_lexize('crossmem_private.spanish_stopwords'::regdictionary, a) is not null
                or a = any(v_unaccented))
           and pg_catalog.ts_lexize('crossmem_private.english_stopwords'::regdictionary, a) is null
           and a <> all('{son,sea,seas,sean,era,eras,sin,hay,ante,contra,uno,todo,han,mia,al,les,como,con,le}'::text[]));
begin
    return (select coalesce(array_agg(t.w order by t.w), '{}')
              from (select d.w from (select distinct w
                                       from unnest(pg_catalog.tsvector_to_array(crossmem_private.searchable(p_query))) w
                                      where char_length(w) > 1
                                        and pg_catalog.ts_lexize('crossmem_private.english_stopwords'::regdictionary, w) is null
                                        and not (v_reads_spanish
                                                 and (w = any(v_unaccented)
                                                      or pg_catalog.ts_lexize('crossmem_private.spanish_stopwords'::regdictionary, w)
                                                         is not null))) d
                     order by char_length(d.w) desc,
                              char_length(pg_catalog.regexp_replace(d.w, '[^\u3040-\u309f]', '', 'g')), d.w
                     limit 16) t);
end;
$$;

-- One word as a query, which stands in for stemming in any language. First its singular: a
-- plural's -s off ("keys", "mesas"; not "-ss"), and -es after s, x, z or h ("taxes", "dishes").
-- A singular under four letters is itself or its plurals ("key": key, keys, keyes); from four
-- letters on, its start as a prefix (two letters off past six: "arrives" finds "arrived").
-- Spanish writes the plural of a word in -z with -ces, which no prefix reaches from a short
-- word: "luz" also finds "luces", and "veces" (or "cruces") "vez" ("cruz"). A Spanish plural in
-- -es of a word in l, n, r, d, j or y leaves a start that is no word ("bares", "redes", "leyes"):
-- it also finds the word itself ("bar", "red", "ley"). A word of four letters in -s may be a
-- singular ("país", "lens"): it also finds what starts with it ("países", "lenses").
create function crossmem_private.term_query(p_term text) returns tsquery
    language sql immutable parallel safe set search_path = '' as $$
    select (case when char_length(s.word) < 4
                 then pg_catalog.quote_literal(s.word) || ' | ' || pg_catalog.quote_literal(s.word || 's')
                      || ' | ' || pg_catalog.quote_literal(s.word || 'es')
                 else pg_catalog.quote_literal(left(s.word, greatest(4, char_length(s.word) - 2))) || ':*'
            end
            || case when p_term ~ '.z$' then ' | ' || pg_catalog.quote_literal(left(p_term, -1) || 'ces')
                    when p_term ~ '..ces$' then ' | ' || pg_catalog.quote_literal(left(p_term, -3) || 'z')
                    when char_length(p_term) >= 5 and p_term ~ '[lnrdjy]es$'
                        then ' | ' || pg_catalog.quote_literal(left(p_term, -2))
                    when char_length(p_term) = 4 and p_term ~ '[^s]s$'
                        then ' | ' || pg_catalog.quote_literal(p_term) || ':*'
                    else ''
               end)::tsquery
      from (select case when char_length(p_term) >= 5 and p_term ~ '[sxzh]es$' then left(p_term, -2)
                        when char_length(p_term) >= 4 and p_term ~ '[^s]s$' then left(p_term, -1)
                        else p_term
                   end as word) s;
$$;

-- The best matches of p_query among the person's messages (p_surface: one app's; p_since and
-- p_until: a period), leaving out p_exclude_ids (a JSON array: what the model already sees),
-- ranked, from p_offset on. Each hit carries the message before and after it in its
-- conversation, and its rank and score under its ranker, so a second ranker (embeddings) can be
-- fused in by rank later (docs/decisions.md). With p_or_latest, when no message matches the words
-- but an app or a period was given ("what did we decide last week on WhatsApp?", whose words the
-- week's messages need not hold: the agent's tool asks so), that app's or period's messages,
-- newest first, ranker 'period': what was said then is what was asked for.
create or replace function public.search_memory(
    p_user_id uuid, p_query text, p_surface text, p_since timestamptz, p_until timestamptz,
    p_exclude_ids text, p_limit integer, p_offset integer, p_or_latest boolean
) returns json language plpgsql stable set search_path = ''
  -- A plan for each person's words: a cached generic plan cannot know how many rows a word
  -- matches, and guessed wrong it scans the person's whole history for every search.
  set plan_cache_mode = force_custom_plan as $$
declare
    v_terms text[] := crossmem_private.search_terms(p_query);
    v_queries tsquery[];
    v_any tsquery;
    v_exclude bigint[] := coalesce((select array_agg(e::bigint) from json_array_elements_text(
                                        coalesce(nullif(p_exclude_ids, ''), '[]')::json) e), '{}');
    v_total bigint;
    v_hits json;
begin
    if cardinality(v_terms) = 0 and not (p_or_latest and (p_surface is not null or p_since is not null
                                                          or p_until is not null)) then
        return json_build_object('terms', '[]'::json, 'hits', '[]'::json);
    end if;
    -- Each word's query once (not once a candidate), and all of them as one.
    select array_agg(crossmem_private.term_query(t) order by n) into v_queries
      from unnest(v_terms) with ordinality as w(t, n);
    select string_agg(q::text, ' | ')::tsquery into v_any from unnest(v_queries) q;
    select count(*) into v_total from public.messages m where m.user_id = p_user_id;

    with candidates as materialized (
        select m.id, m.created_at, m.search_text, pg_catalog.length(m.search_text) as words
          from public.messages m
         where m.user_id = p_user_id
           and m.search_text @@ v_any
           and not m.declined  -- what the model was refused never comes back to it (the column)
           and (p_surface is null or m.surface = p_surface)
           and (p_since is null or m.created_at >= p_since)
           and (p_until is null or m.created_at < p_until)
    ), matched as (
        select c.id, t.term
          from candidates c
          join unnest(v_terms, v_queries) as t(term, q) on c.search_text @@ t.q
    ), rarity as (
        select term, ln(1 + (v_total - count(*) + 0.5) / (count(*) + 0.5)) as idf from matched group by term
    ), typical as (
        select greatest(avg(c.words), 1) as words from candidates c
    ), scored as (
        -- BM25 with every word counted once: the rarer words it shares, the shorter the message.
        select c.id, c.created_at,
               sum(r.idf) * 2.2 / (1 + 1.2 * (0.25 + 0.75 * c.words / t.words))
                   * (1 + 0.2 * exp(-extract(epoch from now() - c.created_at) / (86400 * 60.0))) as score
          from candidates c
          join matched mt on mt.id = c.id
          join rarity r on r.term = mt.term
          cross join typical t
         where c.id <> all(v_exclude)
         group by c.id, c.created_at, c.words, t.words
         order by score desc, c.created_at desc, c.id desc
         limit greatest(p_limit, 0) offset greatest(p_offset, 0)
    ), ranked as (
        select s.id, s.score, 'fulltext' as ranker,
               row_number() over (order by s.score desc, s.created_at desc, s.id desc) + greatest(p_offset, 0) as rank
          from scored s
        union all
        select p.id, 0, 'period',
               row_number() over (order by p.created_at desc, p.id desc) + greatest(p_offset, 0)
          from (select m.id, m.created_at
                  from public.messages m
                 where m.user_id = p_user_id
                   and p_or_latest and (p_surface is not null or p_since is not null or p_until is not null)
                   and not exists (select from candidates c where c.id <> all(v_exclude))
                   and not m.declined
                   and (p_surface is null or m.surface = p_surface)
                   and (p_since is null or m.created_at >= p_since)
                   and (p_until is null or m.created_at < p_until)
                   and m.id <> all(v_exclude)
                 order by m.created_at desc, m.id desc
                 limit greatest(p_limit, 0) offset greatest(p_offset, 0)) p
    )
    select coalesce(json_agg(json_build_object(
               'id', h.id, 'conversation_id', h.conversation_id, 'surface', h.surface, 'role', h.role,
               -- whole up to 20,000 characters (a voice note's transcript of many minutes): the
               -- model is shown a part of a long one, around its words (core/memory/search.py)
               'content', left(h.content, 20000), 'created_at', h.created_at,
               'ranker', r.ranker, 'rank', r.rank, 'score', round(r.score::numeric, 4),
               -- its own words the query matched ("keys" for key, "luz" for luces), the rarest
               -- query word's first: where in a long message to show it from
               'words', (select coalesce(json_agg(w.lexeme order by w.idf desc, w.lexeme), '[]'::json)
                           from (select u.lexeme, max(ra.idf) as idf
                                   from unnest(h.search_text) u
                                   join unnest(v_terms, v_queries) as t(term, q)
                                     on pg_catalog.array_to_tsvector(array[u.lexeme]) @@ t.q
                                   join rarity ra on ra.term = t.term
                                  group by u.lexeme) w),
               'before', (select json_build_object('id', b.id, 'role', b.role, 'content', left(b.content, 2000),
                                                   'created_at', b.created_at)
                            from public.messages b
                           where b.conversation_id = h.conversation_id and b.user_id = p_user_id
                             and (b.created_at, b.id) < (h.created_at, h.id)
                             and not b.declined
                           order by b.created_at desc, b.id desc limit 1),
               'after', (select json_build_object('id', a.id, 'role', a.role, 'content', left(a.content, 2000),
                                                  'created_at', a.created_at)
                           from public.messages a
                          where a.conversation_id = h.conversation_id and a.user_id = p_user_id
                            and (a.created_at, a.id) > (h.created_at, h.id)
                            and not a.declined
                          order by a.created_at, a.id limit 1))
             order by r.rank), '[]'::json)
      into v_hits
      from ranked r
      join public.messages h on h.id = r.id and h.user_id = p_user_id;
    return json_build_object('terms', to_json(v_terms), 'hits', v_hits);
end;
$$;


-- Stopped generations: Telegram's stop button under a draft (Bot API 10.3). The person tapped it
-- while a turn was writing its reply; Telegram tells the bot with a `stopped_message_generation`
-- update, which may reach another instance than the one writing. That webhook records the stop
-- here (stop_generation); the writing turn's drafts thread reads it (generation_stopped), stops
-- reading the model and keeps what the person was shown (docs/decisions.md, Bot API 10.x). An owed
-- message to a number that opted out (an SMS's STOP) is recorded here too, by the job that gives it
-- up (owed_replies.sql's give_up_owed): not wanted, not owed. A row goes with its message (a purge,
-- forgetting).
create table public.stopped_generations (
    message_id bigint not null references public.messages (id) on delete cascade,
    user_id uuid not null,
    stopped_at timestamptz not null default clock_timestamp(),
    primary key (message_id, user_id)
);
alter table public.stopped_generations enable row level security;  -- who reads what: access.sql

-- The person whose private chat is p_chat stopped the draft p_draft_id: the update_id of their
-- message the turn answers (core/surfaces/telegram_inbound.py's draft_id). The person is p_user_id
-- (the owner policy's, which keeps no identity for the owner's chats), else the chat's identity's.
-- Recorded only while that message has no reply (a stop for a finished turn changes nothing), once
-- (a redelivered stop changes nothing); true when this call recorded it. A chat or draft that is
-- nobody's records nothing.
create or replace function public.stop_generation(p_user_id uuid, p_chat text, p_draft_id text)
    returns boolean language plpgsql set search_path = '' as $$
declare
    v_user uuid := p_user_id;
    v_message bigint;
begin
    if v_user is null then
        select i.user_id into v_user
          from public.identities i
         where i.surface = 'telegram' and i.external_id = p_chat;
        if not found then
            return false;
        end if;
    end if;
    select m.id into v_message
      from public.messages m
     where m.user_id = v_user and m.surface = 'telegram' and m.external_id = p_draft_id and m.role = 'user'
       and not exists (select from public.messages r where r.in_reply_to = m.id);
    if not found then
        return false;
    end if;
    insert into public.stopped_generations (message_id, user_id) values (v_message, v_user)
        on conflict do nothing;
    return found;
end;
$$;

-- Whether the person of chat p_chat (p_user_id, else the chat's identity's, as stop_generation
-- reads it) stopped the draft p_draft_id: what a writing turn asks, at most once a draft
-- (core/channels/live_reply.py); three index reads, one round trip.
create or replace function public.generation_stopped(p_user_id uuid, p_chat text, p_draft_id text)
    returns boolean language plpgsql stable set search_path = '' as $$
begin
    return exists (
        select from public.messages m
          join public.stopped_generations s on s.message_id = m.id and s.user_id = m.user_id
         where m.surface = 'telegram' and m.external_id = p_draft_id
           and m.user_id = coalesce(p_user_id, (select i.user_id from public.identities i
                                                 where i.surface = 'telegram' and i.external_id = p_chat)));
end;
$$;
