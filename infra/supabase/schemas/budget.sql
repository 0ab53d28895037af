-- A per-person budget: at most TURNS_PER_MINUTE and TURNS_PER_DAY turns, and TOKENS_PER_DAY
-- model tokens, across all of a person's apps (0 turns a limit off). Counted inside
-- begin_turn's round trip (a turn still costs two); the tokens come with finish_turn's and
-- end_attempt's, added, never written over. Over it, begin_turn stores nothing and answers
-- {"limited_until"}.
--
-- turn_usage holds one row per stored turn and no text, and lives a day: forgetting a
-- conversation does not give its turns back, and the purge of old messages does not touch
-- it. Its rows are kept with no foreign key, so a deleted message leaves its count behind.

create table public.turn_usage (
    message_id bigint primary key,
    user_id uuid not null,
    at timestamptz not null default clock_timestamp(),
    tokens integer not null default 0
);
alter table public.turn_usage enable row level security;  -- who reads what: access.sql
create index turn_usage_by_user on public.turn_usage (user_id, at desc);


-- When the person may write again, or null when they may now. Each limit is a sliding
-- window: a person at the limit may write again when the oldest turn that keeps them
-- there leaves the window. Drops the person's rows older than a day as it goes.
create or replace function public.turn_budget_until(
    p_user_id uuid, p_turns_per_minute integer, p_turns_per_day integer, p_tokens_per_day integer
) returns timestamptz language plpgsql set search_path = '' as $$
declare
    v_now timestamptz := clock_timestamp();
    v_until timestamptz;
    v_at timestamptz;
begin
    delete from public.turn_usage u where u.user_id = p_user_id and u.at <= v_now - interval '1 day';
    if p_turns_per_minute > 0 then
        select u.at into v_at from public.turn_usage u
         where u.user_id = p_user_id and u.at > v_now - interval '1 minute'
         order by u.at desc offset p_turns_per_minute - 1 limit 1;
        v_until := greatest(v_until, v_at + interval '1 minute');
    end if;
    if p_turns_per_day > 0 then
        select u.at into v_at from public.turn_usage u
         where u.user_id = p_user_id
         order by u.at desc offset p_turns_per_day - 1 limit 1;
        v_until := greatest(v_until, v_at + interval '1 day');
    end if;
    if p_tokens_per_day > 0 then
        -- The earliest turn whose leaving brings the day's tokens under the budget.
        select w.at into v_at
          from (select u.at, sum(u.tokens) over (order by u.at, u.message_id) as through,
                       sum(u.tokens) over () as total
                  from public.turn_usage u where u.user_id = p_user_id) w
         where w.total >= p_tokens_per_day and w.total - w.through < p_tokens_per_day
         order by w.at limit 1;
        v_until := greatest(v_until, v_at + interval '1 day');
    end if;
    return v_until;
end;
$$;
