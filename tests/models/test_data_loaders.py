"""Loaders: every format on tiny files, malformed input, dispatch, the real ML-100K."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from models.data.errors import DataFormatError, DatasetNotFoundError
from models.data.generic_csv import load_csv
from models.data.grouplens import load_movielens_1m, load_movielens_100k
from models.data.lastfm import load_lastfm
from models.data.loaders import detect_format, filter_users, load_dataset
from models.data.recbole import load_recbole
from models.data.types import Interactions



def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


def check_invariants(x: Interactions) -> None:
    n = len(x.user)
    assert x.user.dtype == np.int64 and x.item.dtype == np.int64 and x.timestamp.dtype == np.int64
    assert x.rating.dtype == np.float32
    assert len(x.item) == len(x.rating) == len(x.timestamp) == n
    assert x.user.min() >= 0 and x.user.max() < x.n_users
    assert x.item.min() >= 0 and x.item.max() < x.n_items
    # dense: every id occurs
    assert len(np.unique(x.user)) == x.n_users and len(np.unique(x.item)) == x.n_items
    assert len(x.raw_user_ids) == x.n_users and len(x.raw_item_ids) == x.n_items
    # no repeated (user, item), sorted by (user, timestamp)
    assert len(np.unique(x.user * x.n_items + x.item)) == n
    assert np.all(np.diff(x.user) >= 0)
    same = x.user[1:] == x.user[:-1]
    assert np.all(np.diff(x.timestamp)[same] >= 0)
    if x.user_features is not None:
        assert x.user_features.dtype == np.float32
        assert x.user_features.shape == (x.n_users, len(x.user_feature_names))
    if x.item_features is not None:
        assert x.item_features.dtype == np.float32
        assert x.item_features.shape == (x.n_items, len(x.item_feature_names))


# ------------------------------------------------------------------ RecBole

INTER_HEAD = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
USER_HEAD = "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
ITEM_HEAD = "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"


def recbole_files(d: Path, inter: str, user: str | None = None, item: str | None = None) -> Path:
    write(d / "toy.inter", INTER_HEAD + inter)
    if user is not None:
        write(d / "toy.user", USER_HEAD + user)
    if item is not None:
        write(d / "toy.item", ITEM_HEAD + item)
    return d


GOOD_INTER = "10\t1\t5\t300\n2\t1\t3\t100\n2\t3\t4\t100\n10\t3\t1\t200\n2\t1\t4\t400\n"
GOOD_USER = "2\t24\tM\ttechnician\t85711\n10\t53\tF\tother\t94043\n99\t30\tF\twriter\t00000\n"
GOOD_ITEM = (
    "1\tToy Story\t1995\tAnimation Children's Comedy\n"
    "3\tFour Rooms\tunkonwn\tThriller\n"
    "7\tUnrated\t1990\tDrama\n"
)


def test_recbole_ids_features_and_dedupe(tmp_path: Path) -> None:
    x = load_recbole(recbole_files(tmp_path, GOOD_INTER, GOOD_USER, GOOD_ITEM))
    check_invariants(x)
    assert x.name == "toy"
    assert x.raw_user_ids.tolist() == [2, 10]  # numeric order; user 99 has no ratings
    assert x.raw_item_ids.tolist() == [1, 3]  # item 7 unrated: dropped
    # (2, 1) appears twice: the later rating (4 at t=400) wins
    assert len(x.user) == 4
    u2 = x.user == 0
    assert x.item[u2].tolist() == [1, 0] and x.timestamp[u2].tolist() == [100, 400]
    assert x.rating[u2].tolist() == [4.0, 4.0]
    names = x.user_feature_names
    assert names[:7] == ("age:<18", "age:18-24", "age:25-34", "age:35-44", "age:45-49", "age:50-55", "age:56+")
    row = dict(zip(names, x.user_features[0]))
    assert row["age:18-24"] == 1 and row["gender:M"] == 1 and row["occupation:technician"] == 1
    assert "zip_code" not in " ".join(names)
    inames = x.item_feature_names
    assert inames.index("genre:Animation") < inames.index("release_year")
    toy = dict(zip(inames, x.item_features[0]))
    assert toy["genre:Animation"] == toy["genre:Children's"] == toy["genre:Comedy"] == 1
    rooms = dict(zip(inames, x.item_features[1]))
    assert rooms["release_year_missing"] == 1 and rooms["release_year"] == 0
    assert x.item_titles.tolist() == ["Toy Story", "Four Rooms"]


def test_recbole_without_side_files_and_optional_columns(tmp_path: Path) -> None:
    write(tmp_path / "imp.inter", "user_id:token\titem_id:token\nu1\ta\nu1\tb\nu0\ta\n")
    x = load_recbole(tmp_path / "imp.inter")
    check_invariants(x)
    assert x.user_features is None and x.item_features is None
    assert x.raw_user_ids.tolist() == ["u0", "u1"]
    assert np.all(x.rating == 1.0)
    assert x.timestamp.tolist() == [2, 0, 1]  # file order


@pytest.mark.parametrize(
    ("inter", "user", "line", "needle"),
    [
        ("2\t1\t5\n", None, 2, "expected 4 tab-separated columns, found 3"),
        ("2\t1\t5\t1\n2\t3\tfive\t2\n", None, 3, "rating 'five' is not a number"),
        ("2\t1\t5\t1\n2\t3\tnan\t2\n", None, 3, "not a finite number"),
        ("2\t1\t5\t1\n\n2\t3\t4\tnoon\n", None, 4, "timestamp 'noon' is not a number"),
        ("2\t1\t5\t1\n77\t3\t4\t2\n", GOOD_USER, 3, "unknown user id '77' (not in toy.user)"),
        ("2\t1\t5\t1\n", GOOD_USER + "2\t40\tF\tother\t1\n", 5, "duplicate user id"),
        ("\t1\t5\t1\n", None, 2, "empty user id"),
    ],
)
def test_recbole_malformed(tmp_path: Path, inter: str, user: str | None, line: int, needle: str) -> None:
    recbole_files(tmp_path, inter, user)
    with pytest.raises(DataFormatError) as ei:
        load_recbole(tmp_path)
    err = ei.value
    assert err.line == line, str(err)
    assert needle in str(err)
    assert str(err.path.name) in str(err) and f":{line}:" in str(err)


def test_recbole_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "x.inter").write_bytes(INTER_HEAD.encode() + b"1\t2\t3\t4\n1\t\xff\t3\t4\n")
    with pytest.raises(DataFormatError, match=r"x.inter:3: not valid utf-8 text"):
        load_recbole(tmp_path)


def test_recbole_unknown_item_and_bad_header(tmp_path: Path) -> None:
    recbole_files(tmp_path / "a", "2\t1\t5\t1\n2\t42\t4\t2\n", None, GOOD_ITEM)
    with pytest.raises(DataFormatError, match=r"toy.inter:3: unknown item id '42'"):
        load_recbole(tmp_path / "a")
    write(tmp_path / "b" / "x.inter", "user_id\titem_id:token\n1\t2\n")
    with pytest.raises(DataFormatError, match=r"x.inter:1: bad header field 'user_id'"):
        load_recbole(tmp_path / "b")
    write(tmp_path / "c" / "x.inter", "uid:token\titem_id:token\n1\t2\n")
    with pytest.raises(DataFormatError, match="no 'user_id' field"):
        load_recbole(tmp_path / "c")
    recbole_files(tmp_path / "d", "2\t1\t5\t1\n", "2\tforty\tM\tx\t1\n")
    with pytest.raises(DataFormatError, match=r"toy.user:2: age 'forty' is not a number"):
        load_recbole(tmp_path / "d")


# ------------------------------------------------------------------ GroupLens ml-100k


def ml100k_files(d: Path, data: str | None = None, item_flags: str | None = None) -> Path:
    write(d / "u.data", data or "1\t10\t5\t881250949\n2\t10\t3\t881250950\n2\t20\t4\t881250940\n")
    write(d / "u.user", "1|24|M|technician|85711\n2|61|F|other|94043\n", "latin-1")
    flags = item_flags or "0|0|0|1|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0"
    write(
        d / "u.item",
        f"10|Toy Story (1995)|01-Jan-1995||http://x|{flags}\n"
        "20|Café au lait (1993)||||1|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0|0\n",
        "latin-1",
    )
    return d


def test_grouplens_100k(tmp_path: Path) -> None:
    x = load_movielens_100k(ml100k_files(tmp_path))
    check_invariants(x)
    assert (x.n_users, x.n_items, len(x.user)) == (2, 2, 3)
    assert x.item_titles.tolist() == ["Toy Story (1995)", "Café au lait (1993)"]  # latin-1 decoded
    assert "genre:unknown" in x.item_feature_names and "genre:Action" not in x.item_feature_names
    f = dict(zip(x.item_feature_names, x.item_features[0]))
    assert f["genre:Animation"] == f["genre:Children's"] == f["genre:Comedy"] == 1 and f["genre:unknown"] == 0
    cafe = dict(zip(x.item_feature_names, x.item_features[1]))
    assert cafe["release_year_missing"] == 1  # empty release date
    u2 = dict(zip(x.user_feature_names, x.user_features[1]))
    assert u2["age:56+"] == 1 and u2["gender:F"] == 1 and u2["occupation:other"] == 1
    # user 2 rated item 20 first (t=...940), then item 10
    assert x.item[x.user == 1].tolist() == [1, 0]
    assert detect_format(tmp_path) == "ml-100k"


def test_grouplens_100k_malformed(tmp_path: Path) -> None:
    ml100k_files(tmp_path / "a", data="1\t10\t5\t1\n1\t10\t5\n")
    with pytest.raises(DataFormatError, match=r"u.data:2: expected 4 columns separated by '\\t', found 3"):
        load_movielens_100k(tmp_path / "a")
    ml100k_files(tmp_path / "b", item_flags="0|0|0|2|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0")
    with pytest.raises(DataFormatError, match=r"u.item:1: genre flag '2' is not 0 or 1"):
        load_movielens_100k(tmp_path / "b")
    ml100k_files(tmp_path / "c", data="1\t10\t5\t1\n3\t10\t5\t2\n")
    with pytest.raises(DataFormatError, match=r"u.data:2: unknown user id '3' \(not in u.user\)"):
        load_movielens_100k(tmp_path / "c")


# ------------------------------------------------------------------ GroupLens ml-1m


def ml1m_files(d: Path, users: str | None = None) -> Path:
    write(d / "ratings.dat", "1::1193::5::978300760\n1::661::3::978302109\n6040::1193::4::956703932\n", "latin-1")
    write(d / "users.dat", users or "1::F::1::10::48067\n6040::M::25::6::11106\n", "latin-1")
    write(
        d / "movies.dat",
        "661::James and the Giant Peach (1996)::Animation|Children's|Musical\n"
        "1193::One Flew Over the Cuckoo's Nest (1975)::Drama\n",
        "latin-1",
    )
    return d


def test_grouplens_1m(tmp_path: Path) -> None:
    x = load_movielens_1m(ml1m_files(tmp_path))
    check_invariants(x)
    assert x.name == "ml-1m" and (x.n_users, x.n_items, len(x.user)) == (2, 2, 3)
    u = [dict(zip(x.user_feature_names, r)) for r in x.user_features]
    assert u[0]["age:<18"] == 1 and u[0]["gender:F"] == 1 and u[0]["occupation:K-12 student"] == 1
    assert u[1]["age:25-34"] == 1 and u[1]["occupation:doctor/health care"] == 1
    it = dict(zip(x.item_feature_names, x.item_features[0]))  # item 661
    assert it["genre:Musical"] == 1 and it["genre:Animation"] == 1 and it["release_year_missing"] == 0
    assert x.item_features[0, x.item_feature_names.index("release_year")] > 0  # 1996 > 1975
    assert detect_format(tmp_path) == "ml-1m"


def test_grouplens_1m_malformed(tmp_path: Path) -> None:
    ml1m_files(tmp_path, users="1::F::1::10::48067\n6040::M::25::42::11106\n")
    with pytest.raises(DataFormatError, match=r"users.dat:2: occupation code 42 is not in 0..20"):
        load_movielens_1m(tmp_path)


# ------------------------------------------------------------------ LastFM


def lastfm_files(d: Path, ua: str | None = None) -> Path:
    write(d / "user_artists.dat", ua or "userID\tartistID\tweight\n2\t51\t13883\n2\t52\t0\n4\t51\t10\n")
    write(d / "artists.dat", "id\tname\turl\tpictureURL\n51\tDuran Duran\thttp://a\thttp://b\n")
    return d


def test_lastfm(tmp_path: Path) -> None:
    lastfm_files(tmp_path)
    x = load_lastfm(tmp_path)
    check_invariants(x)
    assert np.all(x.rating == 1.0) and x.timestamp.tolist() == [0, 1, 2]
    assert x.item_titles.tolist() == ["Duran Duran", ""]
    xl = load_lastfm(tmp_path, rating="log")
    assert np.allclose(xl.rating, np.log1p([13883, 0, 10]).astype(np.float32))
    assert detect_format(tmp_path) == "lastfm"
    with pytest.raises(ValueError):
        load_lastfm(tmp_path, rating=cast(Any, "raw"))  # not a rating mode


def test_lastfm_malformed(tmp_path: Path) -> None:
    lastfm_files(tmp_path / "a", "user\tartist\tweight\n2\t51\t1\n")
    with pytest.raises(DataFormatError, match="user_artists.dat:1: expected header"):
        load_lastfm(tmp_path / "a")
    lastfm_files(tmp_path / "b", "userID\tartistID\tweight\n2\t51\t1\n2\t52\t-3\n")
    with pytest.raises(DataFormatError, match=r"user_artists.dat:3: negative weight '-3'"):
        load_lastfm(tmp_path / "b")


# ------------------------------------------------------------------ CSV


def test_csv_with_and_without_header(tmp_path: Path) -> None:
    a = load_csv(write(tmp_path / "a.csv", "user,item,rating,timestamp\nu1,i9,4.5,20\nu1,i2,3,10\nu0,i9,1,5\n"))
    check_invariants(a)
    assert a.name == "a" and a.raw_user_ids.tolist() == ["u0", "u1"]
    assert a.raw_item_ids.tolist() == ["i2", "i9"]
    assert a.item[a.user == 1].tolist() == [0, 1] and a.rating.tolist() == [1.0, 3.0, 4.5]
    b = load_csv(write(tmp_path / "b.csv", "3,7,1\n1,7,2\n\n3,8,5\n"))
    check_invariants(b)
    assert b.raw_user_ids.tolist() == [1, 3] and b.timestamp.tolist() == [1, 0, 2]
    assert load_dataset(tmp_path / "b.csv").n_users == 2


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("user,item,rating\n1,2,3\n1,3\n", 3, "expected 3 columns like the first row, found 2"),
        ("1,2,3\n1,3,x\n", 2, "rating 'x' is not a number"),
        ("1,2\n", 1, "expected 3 or 4 columns"),
        ("1,2,3,1\n1,3,4,1.5e9x\n", 2, "timestamp '1.5e9x' is not a number"),
    ],
)
def test_csv_malformed(tmp_path: Path, text: str, line: int, needle: str) -> None:
    p = write(tmp_path / "bad.csv", text)
    with pytest.raises(DataFormatError) as ei:
        load_csv(p)
    assert ei.value.line == line and needle in str(ei.value) and "bad.csv" in str(ei.value)


@pytest.mark.parametrize(
    ("text", "fast"),
    [
        ("user,item,rating,timestamp\n7,12,4.5,20\n7,3,3,10\n2,12,1,5\n", True),
        ("3,7,1\n1,7,2\n3,8,5", True),  # no header, no newline at the end
        ("007,1,2\n7,2,3\n-4,1,1.5\n", True),  # "007" is user 7, as the csv path reads it
        ("3,7,1\r\n1,7,2\r\n", True),
        ("3,7,1\n1,7,2\n\n3,8,5\n", False),  # a blank line: the csv path keeps the line numbers
        ("1,2,3,1\n1,3,4,1.5e9\n", False),  # a timestamp written as a float
        ("u1,i9,4.5\n", False),  # ids that are not integers
    ],
)
def test_a_numeric_csv_loads_as_the_csv_module_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          text: str, fast: bool) -> None:
    """The fast numeric reader (numpy's) against the csv module's path: the
    same interactions, field by field; it steps aside for anything else."""
    import models.data.generic_csv as generic

    p = write(tmp_path / "n.csv", text)
    assert (generic._numeric_columns(p) is not None) == fast
    got = load_csv(p)
    monkeypatch.setattr(generic, "_numeric_columns", lambda _p: None)
    want = load_csv(p)
    check_invariants(got)
    for field in ("user", "item", "rating", "timestamp", "raw_user_ids", "raw_item_ids"):
        a, b = np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
        assert a.dtype == b.dtype and np.array_equal(a, b), field


@pytest.mark.parametrize("text", ["1,2,3\n1,3,nan\n", "1,2,3\n1,3,4 # note\n"])
def test_a_numeric_csv_with_a_bad_line_reports_it(tmp_path: Path, text: str) -> None:
    p = write(tmp_path / "nan.csv", text)
    with pytest.raises(DataFormatError) as ei:
        load_csv(p)
    assert ei.value.line == 2


# ------------------------------------------------------------------ dispatch


def test_load_dataset_dispatch_and_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDMASK_DATA_DIR", raising=False)
    with pytest.raises(DatasetNotFoundError, match="fedmask data fetch ml-100k"):
        load_dataset("ml-100k", tmp_path)
    (tmp_path / "ml-100k").mkdir()
    with pytest.raises(DatasetNotFoundError, match="fedmask data fetch ml-100k"):
        load_dataset("ml-100k", tmp_path)
    with pytest.raises(DatasetNotFoundError, match="not found"):
        load_dataset("ml-1m", tmp_path)
    ml1m_files(tmp_path / "ml-1m")
    assert load_dataset("ml-1m", tmp_path).name == "ml-1m"
    recbole_files(tmp_path / "rb", GOOD_INTER)
    assert load_dataset(tmp_path / "rb").name == "toy"
    monkeypatch.setenv("FEDMASK_DATA_DIR", str(tmp_path))
    assert load_dataset("ml-1m").n_users == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetNotFoundError, match="cannot tell the format"):
        load_dataset(tmp_path / "empty")


def test_filter_users(tmp_path: Path) -> None:
    x = load_csv(write(tmp_path / "f.csv", "1,1,5\n1,2,4\n1,3,3\n2,4,1\n3,1,2\n3,2,2\n"))
    y = filter_users(x, 2)
    check_invariants(y)
    assert y.raw_user_ids.tolist() == [1, 3] and y.raw_item_ids.tolist() == [1, 2, 3]
    assert len(y.user) == 5


# ------------------------------------------------------------------ the real ML-100K

def test_real_ml100k_loads(ml100k_data_dir: Path) -> None:
    x = load_dataset("ml-100k", ml100k_data_dir)
    check_invariants(x)
    assert (x.n_users, x.n_items, len(x.user)) == (943, 1682, 100_000)
    assert np.bincount(x.user).min() >= 20
    assert sorted(np.unique(x.rating).tolist()) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert x.user_features.shape == (943, 7 + 2 + 21)
    assert x.item_features.shape == (1682, 19 + 2)
    assert x.item_features[:, :19].sum(axis=1).min() >= 1  # every movie has a genre


def test_movielens_latest_layout(tmp_path: Path) -> None:
    from models.data.errors import DataFormatError
    from models.data.loaders import detect_format, load_dataset

    d = tmp_path / "ml-latest-small"
    d.mkdir()
    (d / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n1,1029,3.0,1260759179\n2,31,4.5,1260759100\n"
    )
    (d / "movies.csv").write_text(
        'movieId,title,genres\n31,Dangerous Minds (1995),Drama\n'
        '1029,"American President, The (1995)",Comedy|Drama|Romance\n99,Unrated (2000),(no genres listed)\n'
    )
    assert detect_format(d) == "ml-latest"
    x = load_dataset("ml-latest-small", tmp_path)
    assert (x.n_users, x.n_items, len(x.user)) == (2, 2, 3)  # the unrated movie is dropped
    assert x.rating.tolist() == [2.5, 3.0, 4.5] and x.timestamp.tolist()[0] == 1260759144
    assert x.item_titles is not None and list(x.item_titles) == ["Dangerous Minds (1995)", "American President, The (1995)"]
    assert "genre:Romance" in x.item_feature_names and "genre:(no genres listed)" not in x.item_feature_names
    (d / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,77,4,1\n")
    with pytest.raises(DataFormatError, match="unknown item id '77'"):
        load_dataset(d)
    (d / "ratings.csv").write_text("user,movie,rating\n1,31,4\n")
    with pytest.raises(DataFormatError, match="expected header userId,movieId,rating,timestamp"):
        load_dataset(d)
